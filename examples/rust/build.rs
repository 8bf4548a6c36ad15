//! The binary finds libconcord at run time through an rpath to the
//! directory concord-sys linked it from, so it runs without
//! LD_LIBRARY_PATH.
fn main() {
    let libdirs = std::env::var("DEP_CONCORD_LIBDIR").expect("concord-sys is a dependency");
    for dir in std::env::split_paths(&libdirs) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
}
