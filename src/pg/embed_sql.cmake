# Concatenates the numbered sql/*.sql files into one C++ string, in order, so the
# library can apply its schema without the files on disk.
file(GLOB FILES "${SQL_DIR}/*.sql")
list(SORT FILES)
set(body "")
foreach(f IN LISTS FILES)
  file(READ "${f}" text)
  get_filename_component(name "${f}" NAME)
  string(APPEND body "-- ==== ${name} ====\n${text}\n")
endforeach()
set(delim "QSQL_")
file(WRITE "${OUT}.tmp" "// Generated from sql/*.sql by src/pg/embed_sql.cmake. Do not edit.\n#include \"pg/schema.hpp\"\nnamespace qsw {\nconst char *const kSchemaSql = R\"${delim}(${body})${delim}\";\n}\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
