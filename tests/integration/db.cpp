#include "db.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>

#include "pg/schema.hpp"

namespace testdb {

std::string conninfo() {
    const char *c = std::getenv("QUEEN_TEST_CONNINFO");
    if (!c || !*c) {
        ADD_FAILURE() << "QUEEN_TEST_CONNINFO is not set: integration tests need the PostgreSQL that tests/run starts";
        throw std::runtime_error("QUEEN_TEST_CONNINFO is not set");
    }
    return c;
}

std::string sweeper_conninfo() {
    const char *c = std::getenv("QUEEN_TEST_SWEEPER_CONNINFO");
    if (!c || !*c) {
        ADD_FAILURE() << "QUEEN_TEST_SWEEPER_CONNINFO is not set: integration tests need the PostgreSQL "
                         "(and its test roles) that tests/pg start sets up";
        throw std::runtime_error("QUEEN_TEST_SWEEPER_CONNINFO is not set");
    }
    return c;
}

Conn::Conn(const std::string &ci) : pg_(PQconnectdb(ci.c_str())) {
    if (PQstatus(pg_) != CONNECTION_OK) {
        std::string e = PQerrorMessage(pg_);
        PQfinish(pg_);
        pg_ = nullptr;
        throw std::runtime_error("connect: " + e);
    }
    PQsetNoticeProcessor(pg_, [](void *, const char *) {}, nullptr);
}

Conn::~Conn() {
    if (pg_) PQfinish(pg_);
}

void Conn::exec(const std::string &sql) {
    PGresult *r = PQexec(pg_, sql.c_str());
    auto st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        const char *ss = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        std::string msg = std::string(ss ? ss : "") + ": " + PQresultErrorMessage(r);
        PQclear(r);
        throw std::runtime_error(msg);
    }
    PQclear(r);
}

std::string Conn::scalar(const std::string &sql) {
    PGresult *r = PQexec(pg_, sql.c_str());
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        std::string msg = PQresultErrorMessage(r);
        PQclear(r);
        throw std::runtime_error(msg);
    }
    std::string v = PQntuples(r) > 0 && !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0) : "";
    PQclear(r);
    return v;
}

void ensure_schema() {
    static std::once_flag once;
    std::call_once(once, [] {
        Conn c;
        for (int attempt = 0;; ++attempt) {
            try {
                c.exec(qsw::kSchemaSql);
                return;
            } catch (const std::exception &) {
                if (attempt >= 3) throw;
            }
        }
    });
}

std::string pg_script() { return std::string(QUEEN_SOURCE_DIR) + "/tests/pg"; }

std::string run(const std::string &cmd) {
    std::string out;
    FILE *f = popen(cmd.c_str(), "r");
    if (!f) throw std::runtime_error("popen failed: " + cmd);
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
    int rc = pclose(f);
    if (rc != 0) throw std::runtime_error("command failed (" + std::to_string(rc) + "): " + cmd + "\n" + out);
    return out;
}

}  // namespace testdb
