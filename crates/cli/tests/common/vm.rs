//! Helpers of the whole-system tests (`trapline vm`): the plugin built
//! beside the trapline binary, the guest kernel, and recording a program.

use super::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Builds trapline's QEMU plugin once per test binary (as `agent()` builds
/// the agent), beside the trapline binary.
pub fn plugin() -> &'static Path {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN.get_or_init(|| {
        let exe = trapline();
        let dir = exe.parent().expect("trapline in a directory").to_path_buf();
        let profile = match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev".to_string(),
            Some(other) => other.to_string(),
            None => "dev".to_string(),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(workspace_root())
            .args(["build", "-p", "trapline-vm-plugin", "--profile", &profile])
            .output()
            .expect("run cargo build -p trapline-vm-plugin");
        assert!(
            out.status.success(),
            "cargo build -p trapline-vm-plugin failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = dir.join("libtrapline_vm_plugin.so");
        assert!(path.is_file(), "no plugin at {}", path.display());
        path
    })
}

/// The guest kernel: the newest /boot/vmlinuz-VERSION whose headers are
/// installed (the module test builds against them).
pub struct GuestKernel {
    pub image: PathBuf,
    pub headers: PathBuf,
}

pub fn guest_kernel() -> GuestKernel {
    let mut found: Vec<(Vec<u64>, GuestKernel)> = std::fs::read_dir("/boot")
        .expect("read /boot")
        .filter_map(|e| {
            let path = e.ok()?.path();
            let version = path
                .file_name()?
                .to_str()?
                .strip_prefix("vmlinuz-")?
                .to_string();
            let headers = PathBuf::from(format!("/lib/modules/{version}/build"));
            headers.is_dir().then(|| {
                let key = version
                    .split(|c: char| !c.is_ascii_digit())
                    .filter_map(|p| p.parse().ok())
                    .collect();
                (
                    key,
                    GuestKernel {
                        image: path,
                        headers,
                    },
                )
            })
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found.pop().map(|(_, k)| k).expect(
        "no /boot/vmlinuz-VERSION with /lib/modules/VERSION/build: install linux-image-amd64 and linux-headers-amd64 (bookworm-backports), as .ci/run does",
    )
}

/// `trapline vm ARGS`, with the plugin and in `dir`.
pub fn vm(dir: &TestDir, args: &[&str]) -> Finished {
    let mut cmd = Command::new(trapline());
    cmd.arg("vm")
        .args(args)
        .current_dir(dir.path())
        .env("TRAPLINE_VM_PLUGIN", plugin());
    output_of(cmd, &format!("trapline vm {}", args.join(" ")))
}

pub fn record(dir: &TestDir, rec: &str, extra: &[&str], program: &Path) -> Finished {
    let kernel = guest_kernel();
    let image = kernel.image.to_string_lossy().into_owned();
    let program = program.to_string_lossy().into_owned();
    let mut args = vec!["record", "-o", rec, "--kernel", &image];
    args.extend_from_slice(extra);
    args.push("--");
    args.push(&program);
    vm(dir, &args)
}
