//! Generates the raw PJRT C API bindings with bindgen from the header shipped
//! in the pinned `xla_cpu_pjrt` wheel, so no XLA-derived file is committed and
//! the bindings always match the plugin the suite runs against.
//!
//! Header lookup order:
//! 1. env `PJRT_C_API_HEADER` (a path to `pjrt_c_api.h`);
//! 2. `<workspace root>/.venv/lib/python3*/site-packages/xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h`.

use std::env;
use std::path::{Path, PathBuf};

const HEADER_IN_WHEEL: &str = "site-packages/xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PJRT_C_API_HEADER");
    println!("cargo::rustc-check-cfg=cfg(pjrt_has_peak_memory)");

    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let workspace_root = manifest_dir
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest_dir.clone());

    let header = match find_header(&workspace_root) {
        Ok(h) => h,
        Err(msg) => fail(&msg),
    };
    println!("cargo::rerun-if-changed={}", header.display());

    let text = std::fs::read_to_string(&header).unwrap_or_else(|e| {
        fail(&format!(
            "cannot read PJRT C API header {}: {e}",
            header.display()
        ))
    });
    // Fields that appeared in later API minors: expose them only when the header has them.
    if text.contains("peak_memory_in_bytes") {
        println!("cargo::rustc-cfg=pjrt_has_peak_memory");
    }

    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_item("PJRT_.*")
        // Plain integer constants for C enums: a plugin may return values this
        // header does not know, which would be UB with Rust enums.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen failed on {}: {e}", header.display())));

    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("pjrt_c_api.rs");
    bindings
        .write_to_file(&out)
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", out.display())));
    println!(
        "cargo::rustc-env=GRPO_PJRT_HEADER_PATH={}",
        header.display()
    );
}

fn find_header(workspace_root: &Path) -> Result<PathBuf, String> {
    if let Some(p) = env::var_os("PJRT_C_API_HEADER") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "PJRT_C_API_HEADER={} does not exist; unset it or point it at pjrt_c_api.h (run scripts/setup.sh to install the pinned xla_cpu_pjrt wheel)",
                p.display()
            ))
        };
    }
    let venv_lib = workspace_root.join(".venv").join("lib");
    // No rerun-if-changed on the venv directory: cargo would scan all of
    // site-packages on every build. A failed build always reruns, and once
    // found, the header file itself is watched (its removal reruns too).
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(&venv_lib)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path().join(HEADER_IN_WHEEL))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    candidates.sort();
    candidates.pop().ok_or_else(|| {
        format!(
            "PJRT C API header not found at {}/python3*/{HEADER_IN_WHEEL} (and PJRT_C_API_HEADER is unset): run scripts/setup.sh",
            venv_lib.display()
        )
    })
}

/// Fails the build with a single clear line.
fn fail(msg: &str) -> ! {
    println!("cargo::error={msg}");
    // `cargo::error` already fails the build; exiting 0 keeps cargo from
    // dumping the whole build-script output after the one line above.
    std::process::exit(0);
}
