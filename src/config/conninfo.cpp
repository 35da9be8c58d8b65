// Finding and hiding the secrets of a libpq connection string, by hand-written linear scans
// that follow libpq's own parsers (conninfo_parse and conninfo_uri_parse_options in
// fe-connect.c): no regular expression and no recursion, so a long or hostile conninfo
// costs time proportional to its length and a fixed amount of stack.
#include <libpq-fe.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace qsw {
namespace {

constexpr const char *kMask = "*****";

// libpq uses isspace() in the C locale.
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (lower(a[i]) != lower(b[i])) return false;
    return true;
}

size_t ifind(std::string_view hay, std::string_view needle, size_t from = 0) {
    if (needle.empty() || hay.size() < needle.size()) return std::string_view::npos;
    for (size_t i = from; i + needle.size() <= hay.size(); ++i)
        if (iequals(hay.substr(i, needle.size()), needle)) return i;
    return std::string_view::npos;
}

// The keywords whose values libpq treats as secret (dispchar "*"). Compared without case:
// libpq refuses "PASSWORD" as an unknown option, but its value is still meant as one.
bool secret_keyword(std::string_view k) { return iequals(k, "password") || iequals(k, "sslpassword"); }

// The keywords this libpq knows: it refuses any other, and so does the scan, so that "ok"
// means exactly what libpq would say.
bool known_keyword(std::string_view k) {
    static const std::vector<std::string> known = [] {
        std::vector<std::string> v;
        if (PQconninfoOption *o = PQconndefaults()) {
            for (PQconninfoOption *i = o; i->keyword; ++i) v.emplace_back(i->keyword);
            PQconninfoFree(o);
        }
        return v;
    }();
    // Without the list (out of memory), nothing is refused for its name.
    return known.empty() || std::find(known.begin(), known.end(), k) != known.end();
}

size_t uri_prefix_length(std::string_view s) {
    if (s.starts_with("postgresql://")) return 13;
    if (s.starts_with("postgres://")) return 11;
    return 0;
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// libpq's conninfo_uri_decode: %XX with two hex digits, and never %00.
bool uri_decode(std::string_view in, std::string &out) {
    out.clear();
    for (size_t i = 0; i < in.size();) {
        if (in[i] != '%') {
            out += in[i++];
            continue;
        }
        const int hi = i + 1 < in.size() ? hex_value(in[i + 1]) : -1;
        const int lo = hi >= 0 && i + 2 < in.size() ? hex_value(in[i + 2]) : -1;
        if (hi < 0 || lo < 0) return false;
        const int c = hi * 16 + lo;
        if (c == 0) return false;
        out += static_cast<char>(c);
        i += 3;
    }
    return true;
}

struct Found {
    std::string keyword;
    size_t begin = 0, end = 0;  // the value's bytes in the conninfo, as written (quotes included)
    std::string value;          // as libpq stores it: unquoted, unescaped, percent-decoded
    bool pad = false;           // a quoted value ran into the next keyword: the mask needs a space
};

struct Scan {
    bool ok = true;    // libpq's parser would accept the string
    bool uri = false;  // the postgresql:// form
    std::vector<Found> secrets;
    // What libpq's message would quote where it refuses the string (a keyword it could not
    // read, a token it could not decode): a password split by an unescaped space lands here.
    std::vector<std::pair<size_t, std::string>> echoes;  // where it starts, what is quoted
    std::string_view text;

    void fail(size_t b, size_t e) {
        ok = false;
        echoes.emplace_back(b, std::string(text.substr(b, e - b)));
    }
};

// The keyword=value form, as conninfo_parse reads it.
void scan_keywords(std::string_view s, Scan &sc) {
    const size_t n = s.size();
    size_t p = 0;
    while (p < n) {
        while (p < n && is_space(s[p])) ++p;
        if (p >= n) break;
        const size_t kb = p;
        size_t ke = p;
        while (p < n && s[p] != '=' && !is_space(s[p])) ++p;
        ke = p;
        while (p < n && is_space(s[p])) ++p;
        if (p >= n || s[p] != '=') {
            sc.fail(kb, ke);  // missing "=" after a keyword
            return;
        }
        ++p;
        while (p < n && is_space(s[p])) ++p;
        const std::string_view keyword = s.substr(kb, ke - kb);
        const size_t vb = p;
        std::string value;
        if (p < n && s[p] == '\'') {
            ++p;
            bool closed = false;
            while (p < n) {
                if (s[p] == '\\') {
                    ++p;
                    if (p < n) value += s[p++];
                    continue;
                }
                if (s[p] == '\'') {
                    ++p;
                    closed = true;
                    break;
                }
                value += s[p++];
            }
            if (!closed) {
                sc.ok = false;  // unterminated quoted string: hide all of it
                if (secret_keyword(keyword)) sc.secrets.push_back({std::string(keyword), vb, n, value});
                return;
            }
        } else {
            while (p < n && !is_space(s[p])) {
                if (s[p] == '\\') {
                    ++p;
                    if (p < n) value += s[p++];
                } else
                    value += s[p++];
            }
        }
        if (!known_keyword(keyword)) sc.fail(kb, ke);  // scanned on: a later password is still hidden
        if (secret_keyword(keyword))
            sc.secrets.push_back({std::string(keyword), vb, p, std::move(value), p < n && !is_space(s[p])});
    }
}

// The query string of a URI, as conninfo_uri_parse_params reads it.
void scan_uri_params(std::string_view s, size_t p, Scan &sc) {
    const size_t n = s.size();
    std::string key, value;
    while (p < n) {
        const size_t kb = p;
        size_t eq = std::string_view::npos;
        bool extra_separator = false;
        while (p < n && s[p] != '&') {
            if (s[p] == '=') {
                if (eq == std::string_view::npos) eq = p;
                else extra_separator = true;
            }
            ++p;
        }
        const size_t end = p;
        if (p < n) ++p;
        if (eq == std::string_view::npos) {
            sc.fail(kb, end);  // missing key/value separator
            return;
        }
        const std::string_view raw_key = s.substr(kb, eq - kb);
        const bool key_ok = uri_decode(raw_key, key);
        const bool secret = key_ok ? secret_keyword(key) : ifind(raw_key, "password") != std::string_view::npos;
        const bool value_ok = uri_decode(s.substr(eq + 1, end - eq - 1), value);
        if (secret)
            sc.secrets.push_back({key_ok ? key : std::string(raw_key), eq + 1, end,
                                  value_ok ? value : std::string(s.substr(eq + 1, end - eq - 1))});
        if (extra_separator || !key_ok || !value_ok) {
            sc.fail(kb, eq);
            if (!value_ok) sc.fail(eq + 1, end);
            return;
        }
        // libpq turns ssl=true into sslmode=require; any other unknown name it refuses.
        if (!(key == "ssl" && value == "true") && !known_keyword(key)) sc.fail(kb, eq);
    }
}

// The URI's user and password (before an '@'), when it has them: where its hosts begin.
size_t scan_uri_userinfo(std::string_view s, size_t p, Scan &sc) {
    const size_t n = s.size();
    std::string decoded;
    size_t q = p;
    while (q < n && s[q] != '@' && s[q] != '/') ++q;
    if (q >= n || s[q] != '@') return p;
    size_t u = p;
    while (s[u] != ':' && s[u] != '@') ++u;
    if (!uri_decode(s.substr(p, u - p), decoded)) sc.fail(p, u);
    if (s[u] == ':') {
        const size_t pb = u + 1;
        size_t pe = pb;
        while (s[pe] != '@') ++pe;
        if (pe > pb) {
            const bool good = uri_decode(s.substr(pb, pe - pb), decoded);
            sc.secrets.push_back({"password", pb, pe, good ? decoded : std::string(s.substr(pb, pe - pb))});
            if (!good) sc.fail(pb, pe);
        }
        u = pe;
    }
    return u + 1;
}

// The URI's hosts and ports from p on. libpq decodes the hosts joined by commas, and the
// ports so too, and quotes the joined text when it cannot. False when libpq refuses them;
// else p is left on what follows them, and prev is that character ('\0' at the end).
bool scan_uri_hosts(std::string_view s, size_t &p, char &prev, Scan &sc) {
    const size_t n = s.size();
    auto at = [&](size_t i) { return i < n ? s[i] : '\0'; };
    std::string decoded;
    const size_t hosts_begin = p;
    std::string hosts, ports;
    bool hosts_bad = false, ports_bad = false;
    for (;;) {
        const size_t hb = p;
        if (p > hosts_begin) hosts += ',', ports += ',';
        if (at(p) == '[') {
            ++p;
            const size_t h = p;
            while (p < n && s[p] != ']') ++p;
            if (p >= n || p == h) {
                sc.ok = false;  // no closing bracket, or an empty IPv6 address
                return false;
            }
            ++p;
            const char c = at(p);
            if (c != '\0' && c != ':' && c != '/' && c != '?' && c != ',') {
                sc.ok = false;
                return false;
            }
            hosts.append(s.substr(h, p - 1 - h));
            if (!uri_decode(s.substr(h, p - 1 - h), decoded)) hosts_bad = true;
        } else {
            while (p < n && s[p] != ':' && s[p] != '/' && s[p] != '?' && s[p] != ',') ++p;
            hosts.append(s.substr(hb, p - hb));
            if (!uri_decode(s.substr(hb, p - hb), decoded)) hosts_bad = true;
        }
        prev = at(p);
        if (prev == ':') {
            const size_t pb = ++p;
            while (p < n && s[p] != '/' && s[p] != '?' && s[p] != ',') ++p;
            ports.append(s.substr(pb, p - pb));
            if (!uri_decode(s.substr(pb, p - pb), decoded)) ports_bad = true;
            prev = at(p);
        }
        if (prev != ',') break;
        ++p;
    }
    // libpq stores host and port (and fails on their encoding) before it reads the rest.
    if (hosts_bad || ports_bad) {
        sc.ok = false;
        sc.echoes.emplace_back(hosts_begin, hosts_bad ? hosts : ports);
        return false;
    }
    return true;
}

// The URI form, as conninfo_uri_parse_options reads it.
void scan_uri(std::string_view s, size_t prefix, Scan &sc) {
    const size_t n = s.size();
    auto at = [&](size_t i) { return i < n ? s[i] : '\0'; };
    size_t p = scan_uri_userinfo(s, prefix, sc);
    if (!sc.ok) return;
    char prev = '\0';
    if (!scan_uri_hosts(s, p, prev, sc)) return;
    if (prev != '\0' && prev != '?') {
        std::string decoded;
        const size_t db = ++p;
        while (p < n && s[p] != '?') ++p;
        if (!uri_decode(s.substr(db, p - db), decoded)) {
            sc.fail(db, p);
            return;
        }
        prev = at(p);
    }
    if (prev != '\0') scan_uri_params(s, p + 1, sc);
}

Scan scan(std::string_view ci) {
    Scan sc;
    sc.text = ci;
    // libpq reads a C string: whatever follows a NUL byte is never parsed, so it cannot be
    // told apart from a secret.
    const size_t nul = ci.find('\0');
    const std::string_view s = ci.substr(0, nul);
    if (nul != std::string_view::npos) sc.ok = false;
    if (const size_t prefix = uri_prefix_length(s)) {
        sc.uri = true;
        scan_uri(s, prefix, sc);
    } else if (s.find('=') != std::string_view::npos) {
        scan_keywords(s, sc);
    }
    // Otherwise it is a plain database name: libpq parses nothing out of it.
    return sc;
}

// Where a URI's user:password@ would be, read generously: from the first ':' after the
// scheme to the last '@' before the query. libpq stops at the first '@', and a '/' before
// it means no password at all; an operator who wrote a password holding those characters
// still meant all of it. When libpq refuses the URI anyway, the query does not bound it
// either (`whole`).
bool uri_userinfo_password(std::string_view s, size_t prefix, size_t &b, size_t &e, bool whole = false) {
    const size_t query = whole ? std::string_view::npos : s.find('?', prefix);
    const std::string_view before_query = s.substr(0, query);
    const size_t last_at = before_query.rfind('@');
    if (last_at == std::string_view::npos || last_at < prefix) return false;
    const size_t colon = s.find(':', prefix);
    if (colon == std::string_view::npos || colon > last_at) return false;
    b = colon + 1;
    e = last_at;
    return e > b;
}

struct Interval {
    size_t b, e;
    bool pad = false;
};

// Replaces each interval by the mask; overlapping or touching intervals become one mask.
std::string apply_masks(std::string_view s, std::vector<Interval> iv) {
    std::sort(iv.begin(), iv.end(), [](const Interval &x, const Interval &y) { return x.b < y.b; });
    std::string out;
    size_t pos = 0;
    for (size_t i = 0; i < iv.size();) {
        size_t b = iv[i].b, e = iv[i].e;
        bool pad = iv[i].pad;
        for (++i; i < iv.size() && iv[i].b <= e; ++i) {
            if (iv[i].e >= e) pad = iv[i].pad;
            e = std::max(e, iv[i].e);
        }
        b = std::max(b, pos);
        if (e <= b) continue;
        out.append(s.substr(pos, b - pos));
        out += kMask;
        if (pad) out += ' ';
        pos = e;
    }
    if (pos < s.size()) out.append(s.substr(pos));
    return out;
}

// Masks what looks like a password in free text: the value after "password" and "=" or ":"
// (any case; also sslpassword), and user:password@ after "://". Quoted values run to their
// closing quote; others to the next white space. Used where the exact grammar is not known:
// libpq messages, and connection strings libpq would refuse.
std::string mask_patterns(std::string_view s) {
    std::vector<Interval> iv;
    for (size_t at = ifind(s, "password"); at != std::string_view::npos; at = ifind(s, "password", at + 1)) {
        size_t p = at + 8;
        while (p < s.size() && is_space(s[p])) ++p;
        if (p >= s.size() || (s[p] != '=' && s[p] != ':')) continue;
        ++p;
        while (p < s.size() && is_space(s[p])) ++p;
        const size_t vb = p;
        if (p < s.size() && (s[p] == '\'' || s[p] == '"')) {
            const char q = s[p++];
            while (p < s.size() && s[p] != q) p += (s[p] == '\\') ? 2 : 1;
            p = std::min(p + 1, s.size());
        } else {
            while (p < s.size() && !is_space(s[p])) p += (s[p] == '\\') ? 2 : 1;
            p = std::min(p, s.size());
        }
        if (p > vb) iv.push_back({vb, p});
    }
    for (size_t at = s.find("://"); at != std::string_view::npos; ) {
        size_t end = at + 3;
        while (end < s.size() && !is_space(s[end]) && s[end] != '"') ++end;
        // Only this token is searched, and the next search starts after it: linear.
        size_t b = 0, e = 0;
        if (uri_userinfo_password(s.substr(at, end - at), 3, b, e)) iv.push_back({at + b, at + e});
        at = s.find("://", end);
    }
    return iv.empty() ? std::string(s) : apply_masks(s, std::move(iv));
}

void add_candidate(std::vector<std::string> &out, std::string_view v) {
    // Shorter values are not replaced wherever they occur: a two-letter password would
    // erase every message. They are still hidden where a pattern shows them. The count is
    // bounded so that a conninfo of many words costs linear time.
    if (v.size() >= 3 && v != kMask && out.size() < 256 && std::find(out.begin(), out.end(), v) == out.end())
        out.emplace_back(v);
}

void replace_all(std::string &text, std::string_view what, std::string_view with) {
    if (what.empty()) return;
    std::string out;
    size_t pos = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, pos)) {
        out.append(text, pos, at - pos);
        out += with;
        pos = at + what.size();
    }
    if (pos == 0) return;
    out.append(text, pos, std::string::npos);
    text = std::move(out);
}

}  // namespace

bool conninfo_secrets(const std::string &conninfo, std::vector<ConninfoSecret> &out) {
    out.clear();
    Scan sc = scan(conninfo);
    for (auto &f : sc.secrets) out.push_back({f.keyword, f.value});
    return sc.ok;
}

std::string mask_conninfo(const std::string &ci) {
    const Scan sc = scan(ci);
    std::vector<Interval> iv;
    for (const auto &f : sc.secrets) iv.push_back({f.begin, f.end, f.pad});
    if (sc.uri) {
        size_t b = 0, e = 0;
        if (uri_userinfo_password(ci, uri_prefix_length(ci), b, e, !sc.ok)) iv.push_back({b, e});
    }
    if (!sc.ok) {
        // libpq would refuse it, so its grammar does not say where the password ends: hide
        // everything after the first "password", then whatever still looks like one.
        const size_t at = ifind(ci, "password");
        if (at != std::string::npos && at + 8 < ci.size()) iv.push_back({at + 8, ci.size()});
        const size_t nul = ci.find('\0');
        if (nul != std::string::npos) iv.push_back({nul, ci.size()});
        return mask_patterns(apply_masks(ci, std::move(iv)));
    }
    return iv.empty() ? ci : apply_masks(ci, std::move(iv));
}

std::string redact_secrets(const std::string &text, const std::string &conninfo) {
    if (text.empty()) return text;
    std::string out = text;
    // libpq quotes a malformed URI whole in its message.
    if (conninfo.size() >= 3) replace_all(out, conninfo, mask_conninfo(conninfo));
    std::vector<std::string> secrets;
    const Scan sc = scan(conninfo);
    for (const auto &f : sc.secrets) {
        add_candidate(secrets, f.value);
        add_candidate(secrets, std::string_view(conninfo).substr(f.begin, f.end - f.begin));
    }
    if (sc.uri) {
        size_t b = 0, e = 0;
        if (uri_userinfo_password(conninfo, uri_prefix_length(conninfo), b, e, !sc.ok)) {
            const std::string_view raw = std::string_view(conninfo).substr(b, e - b);
            add_candidate(secrets, raw);
            std::string decoded;
            if (uri_decode(raw, decoded)) add_candidate(secrets, decoded);
        }
    }
    if (!sc.ok) {
        // libpq's message may quote any word after the password (an unescaped space split it).
        const size_t at = ifind(conninfo, "password");
        size_t ub = std::string::npos, ue = 0;
        if (sc.uri && !uri_userinfo_password(conninfo, uri_prefix_length(conninfo), ub, ue, true)) ub = std::string::npos;
        for (const auto &[b, raw] : sc.echoes)
            if ((at != std::string::npos && b + raw.size() > at) || (ub != std::string::npos && b < ue && b + raw.size() > ub)) {
                add_candidate(secrets, raw);
                std::string decoded;  // libpq quotes a URI query keyword decoded
                if (sc.uri && uri_decode(raw, decoded)) add_candidate(secrets, decoded);
            }
        if (at != std::string::npos) {
            std::string_view tail = std::string_view(conninfo).substr(at + 8);
            size_t p = 0;
            while (p < tail.size() && (is_space(tail[p]) || tail[p] == '=' || tail[p] == ':')) ++p;
            tail = tail.substr(p);
            add_candidate(secrets, tail);
            for (size_t w = 0; w < tail.size();) {
                while (w < tail.size() && is_space(tail[w])) ++w;
                size_t e = w;
                while (e < tail.size() && !is_space(tail[e])) ++e;
                std::string_view word = tail.substr(w, e - w);
                add_candidate(secrets, word);
                while (!word.empty() && (word.front() == '\'' || word.front() == '"')) word.remove_prefix(1);
                while (!word.empty() && (word.back() == '\'' || word.back() == '"')) word.remove_suffix(1);
                add_candidate(secrets, word);
                w = e;
            }
        }
    }
    // Longest first, so that a secret holding another is replaced whole.
    std::sort(secrets.begin(), secrets.end(),
              [](const std::string &a, const std::string &b) { return a.size() > b.size(); });
    for (const auto &s : secrets) replace_all(out, s, kMask);
    return mask_patterns(out);
}

}  // namespace qsw
