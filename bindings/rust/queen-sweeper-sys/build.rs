//! Where the linker finds libqueen_sweeper.so: $QUEEN_SWEEPER_LIB_DIR, or the
//! repository's build/ tree (../../../build from this crate). No bindgen: the
//! declarations in src/lib.rs are written by hand against abi/queen_sweeper.h.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=QUEEN_SWEEPER_LIB_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let dir = match env::var_os("QUEEN_SWEEPER_LIB_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let manifest = env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
            PathBuf::from(manifest).join("..").join("..").join("..").join("build")
        }
    };
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=queen_sweeper");
    // Visible to dependents' build scripts as DEP_QUEEN_SWEEPER_LIB_DIR.
    println!("cargo:lib_dir={}", dir.display());

    if env::var_os("CARGO_FEATURE_EPHEMERAL").is_some() {
        // $QUEEN_EPHEMERAL_LIB_DIR, or plugins/ephemeral/ of the same build tree.
        println!("cargo:rerun-if-env-changed=QUEEN_EPHEMERAL_LIB_DIR");
        let eph = match env::var_os("QUEEN_EPHEMERAL_LIB_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => dir.join("plugins").join("ephemeral"),
        };
        println!("cargo:rustc-link-search=native={}", eph.display());
        println!("cargo:rustc-link-lib=dylib=queen_ephemeral");
    }
}
