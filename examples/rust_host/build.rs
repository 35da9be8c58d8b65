// Links libpq for the host's own connection (src/pq.rs). `pkg-config --libs
// libpq` would say the same; the system library directory is searched anyway.
fn main() {
    println!("cargo:rerun-if-env-changed=PQ_LIB_DIR");
    if let Some(dir) = std::env::var_os("PQ_LIB_DIR") {
        println!("cargo:rustc-link-search=native={}", dir.to_string_lossy());
    }
    println!("cargo:rustc-link-lib=dylib=pq");
}
