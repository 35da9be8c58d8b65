// The numbered sql/*.sql files, concatenated in order at build time.
#pragma once
namespace qsw {
extern const char *const kSchemaSql;
}
