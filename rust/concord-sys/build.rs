//! Finds libconcord and its header, and tells cargo how to link it.
//!
//! In order: the `pkg-config` program (`pkg-config --libs --cflags
//! concord`, which honours PKG_CONFIG_PATH), then the concord Python
//! package (`$PYTHON -m concord --pkgconfigdir` through pkg-config, or
//! `--libdir` / `--includedir` without it; PYTHON defaults to python3).
//! When neither works the build fails with what each attempt said.
//!
//! Emits the link search path and library, an rpath for this package's own
//! tests, and `libdir` / `include` metadata (DEP_CONCORD_LIBDIR,
//! DEP_CONCORD_INCLUDE for dependents' build scripts).

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Where the library and header were found, and how.
struct Found {
    how: String,
    libdirs: Vec<PathBuf>,
    libs: Vec<String>,
    includedirs: Vec<PathBuf>,
}

fn run(command: &mut Command) -> Result<String, String> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(|e| format!("`{shown}` could not run: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("`{shown}` failed ({}): {}", output.status, stderr.trim()));
    }
    String::from_utf8(output.stdout).map_err(|_| format!("`{shown}` printed non-UTF-8 text"))
}

/// `pkg-config --libs --cflags concord`, with `extra_path` before
/// PKG_CONFIG_PATH when given.
fn from_pkg_config(extra_path: Option<&Path>) -> Result<Found, String> {
    let mut command = Command::new("pkg-config");
    command.args(["--libs", "--cflags", "concord"]);
    let mut how = "pkg-config".to_string();
    if let Some(dir) = extra_path {
        let mut paths = vec![dir.to_path_buf()];
        paths.extend(env::split_paths(&env::var_os("PKG_CONFIG_PATH").unwrap_or_default()));
        command.env("PKG_CONFIG_PATH", env::join_paths(paths).map_err(|e| e.to_string())?);
        how = format!("pkg-config with {}", dir.display());
    }
    let flags = run(&mut command)?;
    let mut found = Found { how, libdirs: vec![], libs: vec![], includedirs: vec![] };
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            found.libdirs.push(PathBuf::from(dir));
        } else if let Some(lib) = flag.strip_prefix("-l") {
            found.libs.push(lib.to_string());
        } else if let Some(dir) = flag.strip_prefix("-I") {
            found.includedirs.push(PathBuf::from(dir));
        }
        // -Wl,-rpath from concord.pc names a libdir already listed by -L.
    }
    if found.libdirs.is_empty() || found.includedirs.is_empty() {
        return Err(format!("pkg-config gave no -L or no -I for concord: `{}`", flags.trim()));
    }
    Ok(found)
}

fn python() -> OsString {
    env::var_os("PYTHON").unwrap_or_else(|| "python3".into())
}

/// A directory `python -m concord <flag>` prints.
fn concord_dir(flag: &str) -> Result<PathBuf, String> {
    let printed = run(Command::new(python()).args(["-m", "concord", flag]))?;
    Ok(PathBuf::from(printed.trim()))
}

fn from_python() -> Result<Found, String> {
    let pkgconfigdir = concord_dir("--pkgconfigdir")?;
    from_pkg_config(Some(&pkgconfigdir)).or_else(|pkg_config_error| {
        let found = Found {
            how: format!("{:?} -m concord --libdir / --includedir", python()),
            libdirs: vec![concord_dir("--libdir")?],
            libs: vec!["concord".to_string()],
            includedirs: vec![concord_dir("--includedir")?],
        };
        println!("cargo:warning=concord-sys: {pkg_config_error}; using {}", found.how);
        Ok(found)
    })
}

/// The header's (major, minor) from concord/version.h.
fn header_version(found: &Found) -> Result<(u32, u32), String> {
    let path = found
        .includedirs
        .iter()
        .map(|dir| dir.join("concord").join("version.h"))
        .find(|path| path.is_file())
        .ok_or_else(|| format!("no concord/version.h in {:?}", found.includedirs))?;
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let define = |name: &str| -> Result<u32, String> {
        text.lines()
            .filter_map(|line| line.strip_prefix("#define "))
            .find_map(|rest| rest.strip_prefix(name)?.trim().parse().ok())
            .ok_or_else(|| format!("{}: no numeric {name}", path.display()))
    };
    Ok((define("CONCORD_VERSION_MAJOR")?, define("CONCORD_VERSION_MINOR")?))
}

fn main() -> ExitCode {
    for variable in ["PKG_CONFIG_PATH", "PYTHON"] {
        println!("cargo:rerun-if-env-changed={variable}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    let mut found = match from_pkg_config(None) {
        Ok(found) => found,
        Err(pkg_config_error) => match from_python() {
            Ok(found) => found,
            Err(python_error) => {
                eprintln!(
                    "concord-sys cannot find libconcord and concord/concord.h.\n\
                     Tried:\n  1. {pkg_config_error}\n  2. {python_error}\n\
                     Install the concord Python package (pip install <concord source>) and set \
                     PYTHON to its interpreter, or put the directory of concord.pc \
                     (`python -m concord --pkgconfigdir`) on PKG_CONFIG_PATH."
                );
                return ExitCode::FAILURE;
            }
        },
    };

    // concord.pc's directories are relative to itself ("pkgconfig/../..").
    for dir in found.libdirs.iter_mut().chain(found.includedirs.iter_mut()) {
        if let Ok(canonical) = fs::canonicalize(&*dir) {
            *dir = canonical;
        }
    }

    // Before 1.0 every minor release may change the ABI, and these
    // declarations mirror one.
    let ours: (u32, u32) = (
        env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap(),
        env!("CARGO_PKG_VERSION_MINOR").parse().unwrap(),
    );
    match header_version(&found) {
        Ok(theirs) if theirs == ours => {}
        Ok((major, minor)) => {
            eprintln!(
                "concord-sys {} mirrors the C ABI of concord {}.{}, but {} found concord \
                 {major}.{minor} (include {:?})",
                env!("CARGO_PKG_VERSION"), ours.0, ours.1, found.how, found.includedirs
            );
            return ExitCode::FAILURE;
        }
        Err(error) => {
            eprintln!("concord-sys: {} found concord, but {error}", found.how);
            return ExitCode::FAILURE;
        }
    }

    for dir in &found.libdirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
        // Only this package's own tests and examples; dependents add their
        // own from DEP_CONCORD_LIBDIR.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    for lib in &found.libs {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    let joined = |dirs: &[PathBuf]| env::join_paths(dirs).unwrap().to_string_lossy().into_owned();
    println!("cargo:libdir={}", joined(&found.libdirs));
    println!("cargo:include={}", joined(&found.includedirs));
    println!("cargo:rustc-env=CONCORD_SYS_INCLUDE={}", joined(&found.includedirs));
    ExitCode::SUCCESS
}
