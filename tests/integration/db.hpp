// Blocking libpq helpers for integration tests: the tests set up and inspect the
// database the simple way, while the sweeper under test talks to it asynchronously.
#pragma once
#include <libpq-fe.h>

#include <string>
#include <vector>

namespace testdb {

// QUEEN_TEST_CONNINFO (the superuser: setup and inspection), or a failed test explaining
// that tests/run sets it.
std::string conninfo();
// QUEEN_TEST_SWEEPER_CONNINFO: a LOGIN role holding the queen_sweeper group role only,
// what the sweepers under test log in as (tests/pg start creates it).
std::string sweeper_conninfo();

class Conn {
public:
    explicit Conn(const std::string &conninfo = testdb::conninfo());
    ~Conn();
    Conn(const Conn &) = delete;
    Conn &operator=(const Conn &) = delete;
    // Runs SQL; throws std::runtime_error with the SQLSTATE on failure.
    void exec(const std::string &sql);
    // First column of the first row, or "" for no row / NULL.
    std::string scalar(const std::string &sql);
    long long count(const std::string &sql) { return std::stoll(scalar(sql)); }
    PGconn *raw() { return pg_; }

private:
    PGconn *pg_;
};

// Applies the embedded schema once per process (idempotent).
void ensure_schema();

// tests/pg, for tests that start a private cluster.
std::string pg_script();
std::string run(const std::string &cmd);

}  // namespace testdb
