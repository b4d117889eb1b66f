//! A recording's directory: QEMU's record/replay log, the initramfs and
//! kernel it booted, the guest's console, the kernel's symbols, and a
//! manifest that ties them together.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::VmError;

pub const MANIFEST: &str = "manifest.json";
pub const REPLAY_LOG: &str = "replay.bin";
pub const INITRAMFS: &str = "initramfs.cpio";
pub const CONSOLE: &str = "console.log";
/// The guest kernel's code symbols (`/proc/kallsyms`), gzip-compressed,
/// from a boot of their own.
pub const KERNEL_SYMBOLS: &str = "kernel.kallsyms.gz";
/// The loaded modules' code symbols, from the recorded boot.
pub const MODULE_SYMBOLS: &str = "modules.kallsyms.gz";

/// Bump when the manifest or the guest's protocol changes.
pub const MANIFEST_VERSION: u32 = 1;

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Manifest {
    pub version: u32,
    pub qemu: String,
    pub kernel: PathBuf,
    pub memory_mb: u32,
    /// QEMU's `-icount` clock of the recording, which its replays must use
    /// (recordings without it used `shift=auto`).
    #[serde(default = "clock_before_it_was_kept")]
    pub icount: String,
    /// The kernel's command line, which its replays must use.
    #[serde(default = "kernel_args_before_they_were_kept")]
    pub kernel_args: String,
    pub program: PathBuf,
    pub argv: Vec<String>,
    pub kernel_allocs: bool,
    /// Prefix of the marker lines `/init` prints.
    pub marker: String,
    pub exit_status: i32,
    /// The command's process id in the guest.
    pub pid: u32,
    pub record_seconds: f64,
    pub replay_log_bytes: u64,
    pub replay_log_crc32: u32,
    pub initramfs_crc32: u32,
    pub console_crc32: u32,
    /// The guest seconds after which `--timeout` stopped the command, when
    /// it did (its exit status is then the signal's, 128 + N).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_after_seconds: Option<f64>,
}

fn clock_before_it_was_kept() -> String {
    "shift=auto".into()
}

fn kernel_args_before_they_were_kept() -> String {
    crate::qemu::KERNEL_ARGS_BEFORE_KEPT.into()
}

pub fn crc_of(path: &Path) -> Result<(u64, u32), VmError> {
    let data =
        std::fs::read(path).map_err(|e| VmError::damaged(format!("{}: {e}", path.display())))?;
    Ok((data.len() as u64, crc32fast::hash(&data)))
}

/// A recording directory, checked whole before a replay.
pub struct Recording {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

impl Recording {
    pub fn open(dir: &Path) -> Result<Recording, VmError> {
        if !dir.is_dir() {
            let what = if dir.exists() {
                "is not a directory"
            } else {
                "does not exist"
            };
            return Err(VmError::damaged(format!(
                "{}: {what}: a recording is the directory `trapline vm record -o DIR` writes",
                dir.display()
            )));
        }
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            VmError::damaged(format!(
                "{}: not a complete recording ({}: {e})",
                dir.display(),
                path.display()
            ))
        })?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| VmError::damaged(format!("{}: {e}", path.display())))?;
        if manifest.version != MANIFEST_VERSION {
            return Err(VmError::damaged(format!(
                "{}: recording format {}, this trapline reads {MANIFEST_VERSION}",
                path.display(),
                manifest.version
            )));
        }
        let rec = Recording {
            dir: dir.to_path_buf(),
            manifest,
        };
        let (size, crc) = crc_of(&rec.path(REPLAY_LOG))?;
        if (size, crc) != (rec.manifest.replay_log_bytes, rec.manifest.replay_log_crc32) {
            return Err(VmError::damaged(format!(
                "{}: damaged: {size} bytes with checksum {crc:08x}, recorded {} bytes with {:08x}",
                rec.path(REPLAY_LOG).display(),
                rec.manifest.replay_log_bytes,
                rec.manifest.replay_log_crc32
            )));
        }
        for (name, want) in [
            (INITRAMFS, rec.manifest.initramfs_crc32),
            (CONSOLE, rec.manifest.console_crc32),
        ] {
            let (_, crc) = crc_of(&rec.path(name))?;
            if crc != want {
                return Err(VmError::damaged(format!(
                    "{}: damaged: its checksum changed since the recording",
                    rec.path(name).display()
                )));
            }
        }
        Ok(rec)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// The kernel's and the modules' symbols of a recording, decompressed.
pub fn all_kernel_symbols(rec: &Recording) -> Result<String, VmError> {
    let mut text = kernel_symbols(&rec.path(KERNEL_SYMBOLS))?;
    let modules = rec.path(MODULE_SYMBOLS);
    if modules.exists() {
        text.push_str(&kernel_symbols(&modules)?);
    }
    Ok(text)
}

/// Symbols a guest dumped, decompressed.
pub fn kernel_symbols(path: &Path) -> Result<String, VmError> {
    use std::io::Read;
    let data =
        std::fs::read(path).map_err(|e| VmError::damaged(format!("{}: {e}", path.display())))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(&data[..])
        .read_to_string(&mut text)
        .map_err(|e| VmError::damaged(format!("{}: damaged ({e})", path.display())))?;
    Ok(text)
}
