//! Links libtandem.so: from $TANDEM_LIB_DIR, else the repository's build/ directory
//! (../../build from this crate). An rpath to that directory is added so that tests and
//! binaries run without LD_LIBRARY_PATH.
use std::env;
use std::path::PathBuf;

fn main() {
    let dir = match env::var("TANDEM_LIB_DIR") {
        Ok(d) => PathBuf::from(d),
        Err(_) => {
            let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
            manifest.join("../../build")
        }
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    println!("cargo:rerun-if-env-changed=TANDEM_LIB_DIR");
    println!("cargo:rerun-if-changed={}", dir.join("libtandem.so").display());
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=tandem");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
}
