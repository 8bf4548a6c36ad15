//! An rpath to libconcord for this package's own tests and examples, so
//! they run without LD_LIBRARY_PATH; concord-sys found the directory.
fn main() {
    if let Ok(libdirs) = std::env::var("DEP_CONCORD_LIBDIR") {
        for dir in std::env::split_paths(&libdirs) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
}
