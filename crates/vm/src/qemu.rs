//! Running `qemu-system-x86_64`: the machine both the recording and its
//! replays use, and a wait that stops QEMU at a deadline.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::VmError;

/// The QEMU binary: `$TRAPLINE_QEMU`, else `qemu-system-x86_64` on PATH.
pub fn binary() -> Result<PathBuf, VmError> {
    if let Some(p) = std::env::var_os("TRAPLINE_QEMU") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(VmError::cannot_run(format!(
                "TRAPLINE_QEMU names {}, which is not a file",
                p.display()
            )));
        }
        return Ok(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join("qemu-system-x86_64");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(VmError::cannot_run(
        "qemu-system-x86_64 is not installed (Debian: apt-get install -t bookworm-backports qemu-system-x86; QEMU 9.2 or later, for its plugin API)".into(),
    ))
}

/// QEMU's version line, checked to be 9.2 or later (the plugin reads guest
/// memory with `qemu_plugin_read_memory_vaddr`, new in 9.2).
pub fn version(qemu: &Path) -> Result<String, VmError> {
    let out = Command::new(qemu)
        .arg("--version")
        .output()
        .map_err(|e| VmError::cannot_run(format!("{}: {e}", qemu.display())))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text.lines().next().unwrap_or("").to_string();
    let number = line
        .split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)
        .unwrap_or("");
    let mut parts = number.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if !out.status.success() || (major, minor) < (9, 2) {
        return Err(VmError::cannot_run(format!(
            "{} is not QEMU 9.2 or later ({}): its plugin API cannot read guest memory",
            qemu.display(),
            if line.is_empty() {
                "no version".into()
            } else {
                line.clone()
            }
        )));
    }
    Ok(line)
}

/// The machine, the same for the recording and every replay: one vCPU, no
/// default devices (no network, no disk), the kernel and initramfs given,
/// serial ports writing to files, and the guest instruction counter as the
/// clock (`-icount`), which record/replay needs.
///
/// The clock: 8 ns of guest time per instruction (`shift=3`), and idle
/// time skipped to the next timer (`sleep=off`), so the guest's time does
/// not follow the host's. With `shift=auto` and sleeping, a guest waiting
/// for its timers did so in real time: the log of leaks.c was 29 MB and its
/// replay took 22 s; now 0.3 MB and 4.4 s (bench/vm.sh).
pub const ICOUNT: &str = "shift=3,sleep=off";
pub struct Machine<'a> {
    pub kernel: &'a Path,
    /// The `-icount` clock ([`ICOUNT`] for a new recording).
    pub icount: &'a str,
    /// The kernel's command line ([`KERNEL_ARGS`] for a new recording).
    pub kernel_args: &'a str,
    pub initramfs: &'a Path,
    pub memory_mb: u32,
    pub console: &'a Path,
    pub symbols: Option<&'a Path>,
}

/// The kernel command line: no address randomization of the kernel (the
/// replay traps it at the addresses of the symbol table dumped in the
/// recording), only emergencies on the console, and a panic ends the guest.
/// The rest shortens the boot, which every record and replay runs, from
/// 13.9 to 9.9 s of guest time (measured with `initcall_debug` on Debian's
/// 6.12 kernel): no check of the kernel's page tables for writable code
/// (`rodata=off`: 2.6 s), and none of the start-up work nothing in the
/// guest uses: the jitter entropy source's self-test (1.1 s), BPF's TCP
/// congestion-control and dummy struct_ops registrations (1.5 s, 0.7 s),
/// the built-in X.509 certificates (1.2 s; modules load unsigned anyway).
pub const KERNEL_ARGS: &str = "console=ttyS0 loglevel=1 nokaslr panic=-1 rdinit=/init rodata=off initcall_blacklist=jent_mod_init,bpf_tcp_ca_kfunc_init,bpf_dummy_struct_ops_init,load_system_certificate_list";

/// The command line of recordings made before the manifest kept it.
pub const KERNEL_ARGS_BEFORE_KEPT: &str = "console=ttyS0 loglevel=1 nokaslr panic=-1 rdinit=/init";

/// QEMU for `machine`; `rr`: `record` or `replay` and the log, or None for
/// a plain run (no clock, no log).
pub fn command(qemu: &Path, machine: &Machine, rr: Option<(&str, &Path)>) -> Command {
    let mut c = Command::new(qemu);
    c.args([
        "-nodefaults",
        "-no-user-config",
        "-machine",
        "pc",
        "-accel",
        "tcg",
    ])
    .args(["-smp", "1", "-m", &machine.memory_mb.to_string()])
    .args(["-display", "none", "-monitor", "none", "-no-reboot"])
    .arg("-kernel")
    .arg(machine.kernel)
    .arg("-initrd")
    .arg(machine.initramfs)
    .args(["-append", machine.kernel_args])
    .arg("-serial")
    .arg(format!("file:{}", machine.console.display()));
    if let Some(symbols) = machine.symbols {
        c.arg("-serial").arg(format!("file:{}", symbols.display()));
    }
    if let Some((rr, log)) = rr {
        c.arg("-icount").arg(format!(
            "{},rr={rr},rrfile={}",
            machine.icount,
            log.display()
        ));
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// How QEMU ended.
pub struct Finished {
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Waits for QEMU; past `timeout`, kills it, so nothing is left running.
pub fn wait(mut child: Child, timeout: Option<Duration>, started: Instant) -> Finished {
    let stderr_pipe = child.stderr.take();
    let stdout_pipe = child.stdout.take();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut p) = stderr_pipe {
            let _ = p.read_to_string(&mut s);
        }
        s
    });
    let out_reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut p) = stdout_pipe {
            let _ = p.read_to_string(&mut s);
        }
        s
    });
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) => {}
            Err(_) => break None,
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            timed_out = true;
            let _ = child.kill();
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = reader.join().unwrap_or_default();
    stderr.push_str(&out_reader.join().unwrap_or_default());
    Finished {
        status,
        timed_out,
        stderr,
        elapsed: started.elapsed(),
    }
}

/// Guest memory (MiB) the kernel and a small command need besides twice
/// the initramfs.
pub const BASE_MEMORY_MB: u64 = 128;

/// Checks that an initramfs of `bytes` fits in a guest of `memory_mb`:
/// the kernel holds the archive and the files unpacked from it at once
/// while it boots (the archive's pages are freed after), and the files
/// stay in memory (the root file system is RAM). Measured with Debian's
/// 6.12 kernel: 64 MiB boots in 256 MiB and 70 does not, 139 in 512 and
/// 169 not ("Initramfs unpacking failed", then a panic), 254 in 1024; so
/// the guest needs 4 times the archive, and twice it plus 128 MiB.
pub fn check_fits(bytes: u64, memory_mb: u32) -> Result<(), VmError> {
    const MIB: u64 = 1 << 20;
    let size = bytes.div_ceil(MIB);
    let needed = (4 * size).max(2 * size + BASE_MEMORY_MB);
    if needed > u64::from(memory_mb) {
        let suggested = needed.div_ceil(64) * 64;
        return Err(VmError::usage(format!(
            "the files carried into the guest take {size} MiB, and the guest holds them in its memory, which must be 4 times that (and at least twice that plus {BASE_MEMORY_MB} MiB) for it to boot: --memory {memory_mb} is too little, give --memory {suggested} or more, or carry fewer files"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_initramfs_must_fit_twice_in_memory_with_room_to_spare() {
        assert!(check_fits(8 << 20, 256).is_ok());
        assert!(check_fits(64 << 20, 256).is_ok());
        let err = check_fits(70 << 20, 256).unwrap_err();
        assert_eq!(err.exit_code, crate::EXIT_USAGE);
        assert!(
            err.message.contains("take 70 MiB") && err.message.contains("--memory 320"),
            "{}",
            err.message
        );
        assert!(check_fits(70 << 20, 320).is_ok());
        assert!(check_fits(169 << 20, 512).is_err());
        assert!(check_fits(254 << 20, 1024).is_ok());
    }
}
