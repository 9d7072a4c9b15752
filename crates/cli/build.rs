//! Embeds the shim (`libkinetrace.so`) in release builds of `kinetrace`, so that `cargo install
//! --path crates/cli` (which installs the binary alone) gives a `kinetrace` that finds its shim:
//! src/shim.rs writes the embedded copy out on first use. cargo gives a build script no way to
//! tell an install from a build (same environment, same target directory), so the switch is the
//! profile: release embeds, dev does not. `KINETRACE_EMBED_SHIM=0` turns it off (the workspace's
//! scripts and CI export it: there the shim is built beside the binary), `=1` forces it on. The shim is built by a
//! second cargo, in release with no debug info, into `$OUT_DIR/shim-target` (a separate target
//! directory: the outer cargo holds its own). A packaged `kinetrace-cli` (crates.io) has no
//! `crates/preload` beside it and embeds nothing (one warning says so).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(kinetrace_embedded_shim)");
    println!("cargo:rerun-if-env-changed=KINETRACE_EMBED_SHIM");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let workspace = manifest.join("../..");
    let embed = match std::env::var("KINETRACE_EMBED_SHIM").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => std::env::var("PROFILE").as_deref() == Ok("release"),
    };
    if !embed {
        return;
    }
    let workspace_manifest = workspace.join("Cargo.toml");
    if !workspace.join("crates/preload/Cargo.toml").is_file() {
        println!(
            "cargo:warning=no crates/preload beside kinetrace-cli: this kinetrace embeds no shim; \
             put libkinetrace.so next to it or set KINETRACE_PRELOAD_PATH"
        );
        return;
    }
    // The shim's code: the preload and agent crates and everything they build on.
    for dir in [
        "Cargo.lock",
        "Cargo.toml",
        "src",
        "build.rs",
        "crates/preload",
        "crates/agent",
        "crates/core",
        "crates/export",
        "crates/cupti",
        "crates/rocm",
        "crates/dynolog",
        "crates/perfetto",
        "sys",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    let target = out.join("shim-target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--lib", "-p", "kinetrace-preload"])
        .arg("--manifest-path")
        .arg(&workspace_manifest)
        .arg("--target-dir")
        .arg(&target)
        // Small and without debug info, whatever the outer profile.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .status();
    let built = target.join("release/libkinetrace.so");
    match status {
        Ok(s) if s.success() && built.is_file() => {
            std::fs::copy(&built, out.join("libkinetrace.so")).expect("copy the shim into OUT_DIR");
            println!("cargo:rustc-cfg=kinetrace_embedded_shim");
        }
        other => println!(
            "cargo:warning=building the shim to embed failed ({other:?}): this kinetrace embeds \
             no shim; put libkinetrace.so next to it or set KINETRACE_PRELOAD_PATH"
        ),
    }
}
