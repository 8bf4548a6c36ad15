//! Every function concord/concord.h declares is declared here, with as many
//! parameters, and the library that links is the version this crate mirrors.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::path::PathBuf;

/// Function name -> parameter count, for each `concord_*(...)` declaration
/// that follows `marker` in `text`. Only what a declaration needs is parsed:
/// the name before '(' and the commas up to the matching ')'.
fn declarations(text: &str, marker: &str) -> BTreeMap<String, usize> {
    let mut found = BTreeMap::new();
    for (start, _) in text.match_indices(marker) {
        let rest = &text[start + marker.len()..];
        let open = rest.find('(').unwrap();
        let Some(name) = rest[..open].split_whitespace().last() else { continue };
        let name = name.trim_start_matches('*');
        if !name.starts_with("concord_") {
            continue;
        }
        let mut depth = 0;
        let mut end = open;
        for (i, ch) in rest[open..].char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let params = rest[open + 1..end].trim();
        let count = if params.is_empty() || params == "void" {
            0
        } else {
            params.matches(',').count() + 1
        };
        found.insert(name.to_string(), count);
    }
    found
}

fn header_text() -> String {
    let path = std::env::split_paths(env!("CONCORD_SYS_INCLUDE"))
        .map(|dir| dir.join("concord").join("concord.h"))
        .find(|path| path.is_file())
        .expect("concord/concord.h in the include directories");
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn every_header_function_is_declared_with_its_parameters() {
    let header = declarations(&header_text(), "CONCORD_API ");
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src").join("lib.rs");
    let rust = declarations(&std::fs::read_to_string(source).unwrap(), "pub fn ");
    assert!(header.len() > 40, "the header parsed into only {} functions", header.len());
    assert_eq!(rust, header);
}

#[test]
fn the_linked_library_is_the_version_mirrored() {
    let version = unsafe { CStr::from_ptr(concord_sys::concord_version()) };
    assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    let major: i32 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
    let minor: i32 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap();
    let patch: i32 = env!("CARGO_PKG_VERSION_PATCH").parse().unwrap();
    let code = unsafe { concord_sys::concord_version_code() };
    assert_eq!(code, major * 10000 + minor * 100 + patch);
}
