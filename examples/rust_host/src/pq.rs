//! Just enough of libpq for the example: a connection, text-format queries
//! with parameters, and bytea unescaping. Declared by hand against libpq-fe.h.

use std::ffi::{c_char, c_int, c_uchar, c_void, CStr, CString};
use std::ptr;

#[repr(C)]
struct PGconn {
    _private: [u8; 0],
}
#[repr(C)]
struct PGresult {
    _private: [u8; 0],
}

const CONNECTION_OK: c_int = 0;
const PGRES_COMMAND_OK: c_int = 1;
const PGRES_TUPLES_OK: c_int = 2;

extern "C" {
    fn PQconnectdbParams(keys: *const *const c_char, values: *const *const c_char, expand: c_int) -> *mut PGconn;
    fn PQstatus(conn: *const PGconn) -> c_int;
    fn PQerrorMessage(conn: *const PGconn) -> *const c_char;
    fn PQfinish(conn: *mut PGconn);
    fn PQexecParams(
        conn: *mut PGconn,
        command: *const c_char,
        n_params: c_int,
        param_types: *const u32,
        param_values: *const *const c_char,
        param_lengths: *const c_int,
        param_formats: *const c_int,
        result_format: c_int,
    ) -> *mut PGresult;
    fn PQresultStatus(res: *const PGresult) -> c_int;
    fn PQntuples(res: *const PGresult) -> c_int;
    fn PQnfields(res: *const PGresult) -> c_int;
    fn PQgetvalue(res: *const PGresult, row: c_int, col: c_int) -> *const c_char;
    fn PQgetisnull(res: *const PGresult, row: c_int, col: c_int) -> c_int;
    fn PQclear(res: *mut PGresult);
    fn PQunescapeBytea(from: *const c_uchar, to_length: *mut usize) -> *mut c_uchar;
    fn PQfreemem(ptr: *mut c_void);
}

/// One libpq connection, closed on drop.
pub struct Conn(*mut PGconn);

/// One cell of a text-format result: None for SQL NULL.
pub type Row = Vec<Option<String>>;

impl Conn {
    pub fn connect(conninfo: &str, application_name: &str) -> Result<Conn, String> {
        let ci = CString::new(conninfo).map_err(|e| e.to_string())?;
        let app = CString::new(application_name).map_err(|e| e.to_string())?;
        let keys = [c"dbname".as_ptr(), c"application_name".as_ptr(), ptr::null()];
        let vals = [ci.as_ptr(), app.as_ptr(), ptr::null()];
        // SAFETY: NULL-terminated arrays of NUL-terminated strings, alive for the call.
        let c = unsafe { PQconnectdbParams(keys.as_ptr(), vals.as_ptr(), 1) };
        let conn = Conn(c);
        // SAFETY: c is a connection object (possibly failed), never NULL except on OOM.
        if c.is_null() || unsafe { PQstatus(c) } != CONNECTION_OK {
            return Err(conn.error());
        }
        Ok(conn)
    }

    fn error(&self) -> String {
        if self.0.is_null() {
            return "out of memory".into();
        }
        // SAFETY: a live connection; the message is owned by it.
        unsafe { CStr::from_ptr(PQerrorMessage(self.0)) }.to_string_lossy().trim().to_string()
    }

    /// Runs sql with text parameters; returns the rows (empty for a command).
    pub fn query(&self, sql: &str, params: &[&str]) -> Result<Vec<Row>, String> {
        let c_sql = CString::new(sql).map_err(|e| e.to_string())?;
        let c_params: Vec<CString> =
            params.iter().map(|p| CString::new(*p)).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
        let ptrs: Vec<*const c_char> = c_params.iter().map(|p| p.as_ptr()).collect();
        // SAFETY: every pointer is alive for the call; NULL types/lengths/formats mean text.
        let res = unsafe {
            PQexecParams(self.0, c_sql.as_ptr(), ptrs.len() as c_int, ptr::null(), ptrs.as_ptr(), ptr::null(),
                         ptr::null(), 0)
        };
        // SAFETY: res is a result (or NULL, which PQresultStatus reports as fatal).
        let status = unsafe { PQresultStatus(res) };
        if status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK {
            let err = self.error();
            unsafe { PQclear(res) };
            return Err(format!("{err} (in: {sql})"));
        }
        let mut rows = Vec::new();
        // SAFETY: res is a valid result until PQclear; values are NUL-terminated.
        unsafe {
            for r in 0..PQntuples(res) {
                let mut row = Vec::new();
                for c in 0..PQnfields(res) {
                    if PQgetisnull(res, r, c) != 0 {
                        row.push(None);
                    } else {
                        row.push(Some(CStr::from_ptr(PQgetvalue(res, r, c)).to_string_lossy().into_owned()));
                    }
                }
                rows.push(row);
            }
            PQclear(res);
        }
        Ok(rows)
    }

    pub fn exec(&self, sql: &str) -> Result<(), String> {
        self.query(sql, &[]).map(|_| ())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: we own the connection; PQfinish accepts a failed one.
        if !self.0.is_null() {
            unsafe { PQfinish(self.0) }
        }
    }
}

/// A bytea in text output form ("\x..." hex) as bytes.
pub fn unescape_bytea(text: &str) -> Vec<u8> {
    let c = CString::new(text).expect("bytea text has no NUL");
    let mut len = 0usize;
    // SAFETY: c is NUL-terminated; the result is freed with PQfreemem below.
    unsafe {
        let p = PQunescapeBytea(c.as_ptr() as *const c_uchar, &mut len);
        if p.is_null() {
            return Vec::new();
        }
        let out = std::slice::from_raw_parts(p, len).to_vec();
        PQfreemem(p as *mut c_void);
        out
    }
}
