//! Uses the committed bindings in `src/generated/` unless asked to regenerate.
//!
//! `KINETRACE_CUPTI_REGEN=1 cargo build -p kinetrace-cupti-sys` runs `regen.sh` into `OUT_DIR` (it
//! needs the pinned wheels, libclang and bindgen-cli, and installs them) and compiles those files
//! instead. A plain `cargo build` needs no CUDA, no headers and no libclang.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kinetrace_cupti_regenerated)");
    println!("cargo::rerun-if-env-changed=KINETRACE_CUPTI_REGEN");
    println!("cargo::rerun-if-changed=build.rs");
    if env::var("KINETRACE_CUPTI_REGEN")
        .map(|v| v == "1")
        .unwrap_or(false)
    {
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        let script =
            PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).join("regen.sh");
        let status = Command::new("bash").arg(&script).arg(&out).status();
        match status {
            Ok(s) if s.success() => println!("cargo::rustc-cfg=kinetrace_cupti_regenerated"),
            Ok(s) => panic!(
                "{} failed ({s}); unset KINETRACE_CUPTI_REGEN to use the committed bindings",
                script.display()
            ),
            Err(e) => panic!("cannot run {}: {e}", script.display()),
        }
    }
}
