//! Where the linker finds libqueen_sweeper.so, in order:
//!
//! 1. `$QUEEN_SWEEPER_LIB_DIR`, taken as given;
//! 2. the repository's build/ tree (../../../build from this crate), when the crate is
//!    built from a checkout and the library is there;
//! 3. `pkg-config --variable=libdir queen-sweeper` (the program, run directly: no crates),
//!    i.e. an installed library (`cmake --install`);
//!
//! and otherwise the build fails with a message that says what to set. With the
//! `ephemeral` feature libqueen_ephemeral.so is found the same way
//! (`$QUEEN_EPHEMERAL_LIB_DIR`, `<build>/plugins/ephemeral`, pkg-config `queen-ephemeral`,
//! the directory libqueen_sweeper.so was found in).
//!
//! No bindgen: the declarations in src/lib.rs are written by hand against
//! abi/queen_sweeper.h.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A non-empty environment variable as a path.
fn env_dir(name: &str) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed={name}");
    match env::var_os(name) {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => None,
    }
}

/// `pkg-config --variable=libdir PACKAGE`: Ok(dir), or Err(what happened), for the message.
fn pkg_config_libdir(package: &str) -> Result<PathBuf, String> {
    let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(&program)
        .args(["--print-errors", "--variable=libdir", package])
        .output()
        .map_err(|e| format!("could not run {program}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or("").trim().to_string();
        return Err(format!("{program} found no {package}.pc ({first})"));
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if dir.is_empty() {
        return Err(format!("{package}.pc names no libdir"));
    }
    Ok(PathBuf::from(dir))
}

fn has_lib(dir: &Path, name: &str) -> bool {
    dir.join(format!("lib{name}.so")).exists() || dir.join(format!("lib{name}.so.1")).exists()
}

/// The first place that holds lib`name`.so, or every reason why none did.
fn find(
    name: &str,
    package: &str,
    var: &str,
    build_dir: Option<PathBuf>,
    also: Option<PathBuf>,
) -> Result<PathBuf, Vec<String>> {
    if let Some(dir) = env_dir(var) {
        return Ok(dir); // as given: a wrong directory shows as a link error naming it
    }
    let mut tried = vec![format!("${var}: not set")];
    if let Some(dir) = build_dir {
        if has_lib(&dir, name) {
            return Ok(dir);
        }
        tried.push(format!("build tree: no lib{name}.so in {}", dir.display()));
    }
    match pkg_config_libdir(package) {
        Ok(dir) if has_lib(&dir, name) => return Ok(dir),
        Ok(dir) => tried.push(format!(
            "pkg-config {package}: libdir {} holds no lib{name}.so",
            dir.display()
        )),
        Err(e) => tried.push(format!("pkg-config {package}: {e}")),
    }
    if let Some(dir) = also {
        if has_lib(&dir, name) {
            return Ok(dir);
        }
        tried.push(format!("no lib{name}.so in {}", dir.display()));
    }
    Err(tried)
}

/// Says what to set and exits: a plain message, not a panic with a backtrace.
fn fail(name: &str, package: &str, var: &str, tried: &[String]) -> ! {
    eprintln!(
        "\n\ncannot find lib{name}.so. Set {var} to the directory that holds it (for example \
         <repo>/build after `cmake --build build`), or install it (`cmake --install build`) and \
         make {package}.pc visible to pkg-config (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig).\n\
         Tried:\n  {}\n\n",
        tried.join("\n  ")
    );
    std::process::exit(1);
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_LIBDIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");
    let manifest = env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let checkout_build = PathBuf::from(manifest).join("..").join("..").join("..").join("build");

    let dir = match find("queen_sweeper", "queen-sweeper", "QUEEN_SWEEPER_LIB_DIR",
                         Some(checkout_build), None) {
        Ok(dir) => dir,
        Err(tried) => fail("queen_sweeper", "queen-sweeper", "QUEEN_SWEEPER_LIB_DIR", &tried),
    };
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=queen_sweeper");
    // Visible to dependents' build scripts as DEP_QUEEN_SWEEPER_LIB_DIR.
    println!("cargo:lib_dir={}", dir.display());

    if env::var_os("CARGO_FEATURE_EPHEMERAL").is_some() {
        let eph = match find("queen_ephemeral", "queen-ephemeral", "QUEEN_EPHEMERAL_LIB_DIR",
                             Some(dir.join("plugins").join("ephemeral")), Some(dir.clone())) {
            Ok(d) => d,
            Err(tried) => fail("queen_ephemeral", "queen-ephemeral", "QUEEN_EPHEMERAL_LIB_DIR", &tried),
        };
        println!("cargo:rustc-link-search=native={}", eph.display());
        println!("cargo:rustc-link-lib=dylib=queen_ephemeral");
    }
}
