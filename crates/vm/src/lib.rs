//! Whole-system record and replay: `trapline vm record` runs a program
//! inside a small Linux guest under QEMU with record/replay on (the
//! guest's instruction count is its clock, every outside input is
//! logged), and `trapline vm replay` replays that recording with
//! trapline's QEMU plugin (`crates/vm-plugin`), which traps the program's
//! allocator and, on request, the guest kernel's, at their guest
//! addresses. The plugin's raw log is turned here into the trace the
//! agent writes, so every analysis reads it unchanged.
//!
//! A replay cannot change what the program did: the heavy work happens in
//! a replay, and the recording pays only for TCG and the log.

#![forbid(unsafe_code)]

pub mod console;
mod convert;
pub mod cpio;
pub mod guest;
mod locks;
mod plan;
pub mod qemu;
pub mod raw;
pub mod recording;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use convert::Converted;
use recording::{Manifest, Recording};

/// An error, with the exit status the command ends with.
#[derive(Debug)]
pub struct VmError {
    pub message: String,
    pub exit_code: u8,
}

/// `trapline run`'s statuses, for the same failures.
pub const EXIT_ANALYSIS_ERROR: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_TIMED_OUT: u8 = 124;
pub const EXIT_CANNOT_RUN: u8 = 125;

impl VmError {
    pub fn usage(message: String) -> VmError {
        VmError {
            message,
            exit_code: EXIT_USAGE,
        }
    }
    pub fn cannot_run(message: String) -> VmError {
        VmError {
            message,
            exit_code: EXIT_CANNOT_RUN,
        }
    }
    pub fn damaged(message: String) -> VmError {
        VmError {
            message,
            exit_code: EXIT_ANALYSIS_ERROR,
        }
    }
}

impl std::fmt::Display for VmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

pub struct RecordRequest {
    pub output: PathBuf,
    pub program: PathBuf,
    pub argv: Vec<String>,
    pub kernel: Option<PathBuf>,
    pub kernel_allocs: bool,
    /// `--file`s, absolute: regular files and directory trees.
    pub files: Vec<PathBuf>,
    pub modules: Vec<PathBuf>,
    /// The host's current directory, absolute: the command starts there in
    /// the guest, and its file arguments are found from it.
    pub cwd: PathBuf,
    pub memory_mb: u32,
    /// Guest time after which the guest's `/init` stops the command.
    pub timeout: Option<Duration>,
    /// Told what is left out of the guest, before it boots.
    pub warn: fn(&str),
}

pub struct RecordOutcome {
    pub manifest: Manifest,
    /// What the command wrote to its stdout and its stderr.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The signals `--timeout` sent it ("TERM", then "KILL"), if it did.
    pub stopped: Vec<String>,
}

/// The wall-clock bound of a recording with `--timeout` (guest time): a
/// guest that never powers off is stopped from the host.
pub fn wall_limit(timeout: Duration) -> Duration {
    timeout * 10 + Duration::from_secs(120)
}

/// The newest kernel in /boot.
fn default_kernel() -> Result<PathBuf, VmError> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/boot")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|p| version_key(&p.to_string_lossy()));
    found.pop().ok_or_else(|| {
        VmError::cannot_run(
            "no guest kernel in /boot (Debian: apt-get install linux-image-amd64), or give --kernel"
                .into(),
        )
    })
}

/// Orders "vmlinuz-6.12.9" before "vmlinuz-6.12.10".
fn version_key(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// A marker prefix no program prints by chance.
fn marker() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{now} {}", std::process::id());
    format!("TRAPLINE-{:08x}", crc32fast::hash(seed.as_bytes()))
}

pub fn record(req: &RecordRequest) -> Result<RecordOutcome, VmError> {
    let dir = &req.output;
    if dir.exists() && std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_some()) {
        return Err(VmError::usage(format!(
            "{} exists: give a new directory for the recording",
            dir.display()
        )));
    }
    let kernel = match &req.kernel {
        Some(k) => k.clone(),
        None => default_kernel()?,
    };
    if !kernel.is_file() {
        return Err(VmError::usage(format!(
            "{}: no such kernel",
            kernel.display()
        )));
    }
    for f in &req.modules {
        if !f.is_file() {
            return Err(VmError::usage(format!("{}: no such file", f.display())));
        }
    }
    let marker = marker();
    let spec = guest::Guest {
        program: &req.program,
        argv: &req.argv,
        files: &req.files,
        modules: &req.modules,
        cwd: &req.cwd,
        timeout: req.timeout,
        kernel_symbols: req.kernel_allocs,
        marker: &marker,
    };
    let contents = guest::Contents::of(&spec)?;
    for w in &contents.warnings {
        (req.warn)(w);
    }
    qemu::check_fits(contents.size(), req.memory_mb)?;
    let qemu = qemu::binary()?;
    let qemu_version = qemu::version(&qemu)?;
    let initramfs = guest::initramfs(&spec, &contents)?;
    qemu::check_fits(initramfs.len() as u64, req.memory_mb)?;
    std::fs::create_dir_all(dir).map_err(|e| VmError::usage(format!("{}: {e}", dir.display())))?;
    let write = |name: &str, data: &[u8]| {
        std::fs::write(dir.join(name), data)
            .map_err(|e| VmError::usage(format!("{}: {e}", dir.join(name).display())))
    };
    write(recording::INITRAMFS, &initramfs)?;
    let console = dir.join(recording::CONSOLE);
    let symbols = dir.join(recording::MODULE_SYMBOLS);
    let machine = qemu::Machine {
        kernel: &kernel,
        icount: qemu::ICOUNT,
        kernel_args: qemu::KERNEL_ARGS,
        initramfs: &dir.join(recording::INITRAMFS),
        memory_mb: req.memory_mb,
        console: &console,
        symbols: req.kernel_allocs.then_some(symbols.as_path()),
    };
    let log = dir.join(recording::REPLAY_LOG);
    let wall = req.timeout.map(wall_limit);
    if req.kernel_allocs {
        dump_kernel_symbols(&qemu, &kernel, dir, wall)?;
    }
    let started = Instant::now();
    let child = qemu::command(&qemu, &machine, Some(("record", &log)))
        .spawn()
        .map_err(|e| VmError::cannot_run(format!("{}: {e}", qemu.display())))?;
    let finished = qemu::wait(child, wall, started);
    let text = std::fs::read(&console).unwrap_or_default();
    let ran = console::parse(&text, &marker);
    let fail = |message: String, code: u8| {
        // A recording that did not end is no recording: its log goes, the
        // console stays for a look.
        let _ = std::fs::remove_file(&log);
        VmError {
            message: format!("{message}\nthe guest's console is in {}", console.display()),
            exit_code: code,
        }
    };
    if finished.timed_out {
        return Err(fail(
            format!(
                "the guest did not power off within {:.0} s of wall time (10 times --timeout, plus 2 minutes): QEMU was stopped{}",
                wall.unwrap_or_default().as_secs_f64(),
                if ran.pid.is_some() && ran.exit_status.is_none() {
                    ", the command had not exited"
                } else {
                    ""
                }
            ),
            EXIT_TIMED_OUT,
        ));
    }
    if !finished.status.is_some_and(|s| s.success()) {
        return Err(fail(
            format!("QEMU failed: {}", finished.stderr.trim()),
            EXIT_CANNOT_RUN,
        ));
    }
    if let Some(why) = &ran.failed {
        return Err(fail(format!("the guest could not {why}"), EXIT_CANNOT_RUN));
    }
    let (Some(pid), Some(exit_status)) = (ran.pid, ran.exit_status) else {
        let why = match ran.panic {
            Some(line) => format!("the guest kernel panicked: {line}"),
            None => "the guest stopped before the command ended".to_string(),
        };
        return Err(fail(why, EXIT_CANNOT_RUN));
    };
    if ran.libraries.is_empty() {
        return Err(fail(
            "the guest's loader listed no libraries for the command".into(),
            EXIT_CANNOT_RUN,
        ));
    }
    let (log_bytes, log_crc) = recording::crc_of(&log)?;
    let manifest = Manifest {
        version: recording::MANIFEST_VERSION,
        qemu: qemu_version,
        kernel: kernel.canonicalize().unwrap_or(kernel),
        memory_mb: req.memory_mb,
        icount: qemu::ICOUNT.into(),
        kernel_args: qemu::KERNEL_ARGS.into(),
        program: req.program.clone(),
        argv: req.argv.clone(),
        kernel_allocs: req.kernel_allocs,
        marker,
        exit_status,
        pid,
        record_seconds: finished.elapsed.as_secs_f64(),
        replay_log_bytes: log_bytes,
        replay_log_crc32: log_crc,
        initramfs_crc32: crc32fast::hash(&initramfs),
        console_crc32: crc32fast::hash(&text),
        stopped_after_seconds: (!ran.stopped.is_empty())
            .then(|| req.timeout.unwrap_or_default().as_secs_f64()),
    };
    let json = serde_json::to_string_pretty(&manifest).expect("serializable");
    write(recording::MANIFEST, json.as_bytes())?;
    Ok(RecordOutcome {
        manifest,
        stdout: ran.stdout,
        stderr: ran.stderr,
        stopped: ran.stopped,
    })
}

/// Boots `kernel` once, unrecorded, to dump its code symbols into
/// `dir` (the recorded boot adds the modules').
fn dump_kernel_symbols(
    qemu: &Path,
    kernel: &Path,
    dir: &Path,
    timeout: Option<Duration>,
) -> Result<(), VmError> {
    let initramfs = dir.join("symbols-initramfs.cpio");
    let archive = guest::archive(guest::SYMBOLS_INIT)?;
    std::fs::write(&initramfs, archive)
        .map_err(|e| VmError::usage(format!("{}: {e}", initramfs.display())))?;
    let console = dir.join("symbols-console.log");
    let symbols = dir.join(recording::KERNEL_SYMBOLS);
    let machine = qemu::Machine {
        kernel,
        icount: qemu::ICOUNT,
        kernel_args: qemu::KERNEL_ARGS,
        initramfs: &initramfs,
        memory_mb: 256,
        console: &console,
        symbols: Some(&symbols),
    };
    let started = Instant::now();
    let child = qemu::command(qemu, &machine, None)
        .spawn()
        .map_err(|e| VmError::cannot_run(format!("{}: {e}", qemu.display())))?;
    // A boot to a shell that dumps a file: minutes mean it hangs.
    let limit = timeout.unwrap_or(Duration::from_secs(300));
    let finished = qemu::wait(child, Some(limit), started);
    let _ = std::fs::remove_file(&initramfs);
    let dumped = recording::kernel_symbols(&symbols);
    if finished.timed_out || !finished.status.is_some_and(|s| s.success()) || dumped.is_err() {
        return Err(VmError::cannot_run(format!(
            "the boot that dumps the kernel's symbols failed{}: {}; its console is in {}",
            if finished.timed_out {
                " (it did not end in time)"
            } else {
                ""
            },
            finished.stderr.trim(),
            console.display()
        )));
    }
    let _ = std::fs::remove_file(&console);
    Ok(())
}

pub struct ReplayRequest {
    pub recording: PathBuf,
    pub output: PathBuf,
    pub plugin: PathBuf,
    pub timeout: Option<Duration>,
    /// Replay twice and require identical event streams.
    pub verify: bool,
    /// Bytes of a user stack copied at each trapped call.
    pub stack_bytes: usize,
    /// CPU samples per second of the guest's clock, while the traced
    /// process runs (`trapline run --profile`'s rate, in guest time).
    pub profile_hz: Option<u32>,
}

pub struct ReplayOutcome {
    pub converted: Converted,
    pub manifest: Manifest,
    pub replay_seconds: Vec<f64>,
    pub raw_bytes: u64,
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, VmError> {
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("trapline-vm-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| VmError::cannot_run(format!("{}: {e}", dir.display())))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn replay(req: &ReplayRequest) -> Result<ReplayOutcome, VmError> {
    let rec = Recording::open(&req.recording)?;
    let m = &rec.manifest;
    if !req.plugin.is_file() {
        return Err(VmError::cannot_run(format!(
            "{}: trapline's QEMU plugin is missing (build it: cargo build -p trapline-vm-plugin)",
            req.plugin.display()
        )));
    }
    if let Some(parent) = req.output.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            return Err(VmError::usage(format!(
                "{}: no such directory",
                parent.display()
            )));
        }
    }
    let qemu = qemu::binary()?;
    qemu::version(&qemu)?;
    let console_text =
        std::fs::read(rec.path(recording::CONSOLE)).map_err(|e| VmError::damaged(e.to_string()))?;
    let ran = console::parse(&console_text, &m.marker);
    let kernel_symbols = if m.kernel_allocs {
        Some(recording::all_kernel_symbols(&rec)?)
    } else {
        None
    };
    let layout = plan::Layout::new(&m.program, &ran.libraries)?;
    let tmp = TempDir::new()?;
    let plan_path = tmp.0.join("plan");
    let sample_every = req
        .profile_hz
        .map(|hz| convert::instructions_per_sample(hz, &m.icount));
    let plan = plan::build(
        &layout,
        kernel_symbols.as_deref(),
        req.stack_bytes,
        sample_every,
    )?;
    std::fs::write(&plan_path, &plan.text).map_err(|e| VmError::cannot_run(e.to_string()))?;
    let rounds = if req.verify { 2 } else { 1 };
    let mut raws = Vec::new();
    let mut seconds = Vec::new();
    for round in 0..rounds {
        let raw_path = tmp.0.join(format!("raw{round}"));
        let console = tmp.0.join(format!("console{round}"));
        let symbols = tmp.0.join(format!("symbols{round}"));
        let machine = qemu::Machine {
            kernel: &m.kernel,
            icount: &m.icount,
            kernel_args: &m.kernel_args,
            initramfs: &rec.path(recording::INITRAMFS),
            memory_mb: m.memory_mb,
            console: &console,
            symbols: m.kernel_allocs.then_some(symbols.as_path()),
        };
        let mut cmd = qemu::command(
            &qemu,
            &machine,
            Some(("replay", &rec.path(recording::REPLAY_LOG))),
        );
        cmd.arg("-plugin").arg(format!(
            "{},plan={},out={}",
            req.plugin.display(),
            plan_path.display(),
            raw_path.display()
        ));
        let started = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| VmError::cannot_run(format!("{}: {e}", qemu.display())))?;
        let timeout = req
            .timeout
            .unwrap_or(Duration::from_secs_f64(m.record_seconds * 30.0 + 120.0));
        let finished = qemu::wait(child, Some(timeout), started);
        seconds.push(finished.elapsed.as_secs_f64());
        let raw = std::fs::read(&raw_path).unwrap_or_default();
        let last = raw::last_event(&raw);
        if finished.timed_out {
            return Err(VmError {
                message: format!(
                    "the replay did not finish within {:.0} s: QEMU was stopped (last event: {last})",
                    timeout.as_secs_f64()
                ),
                exit_code: EXIT_TIMED_OUT,
            });
        }
        if !finished.status.is_some_and(|s| s.success()) || finished.stderr.contains("plugin") {
            let err = finished.stderr.trim();
            let why = if err.contains("plugin") && raw.is_empty() {
                format!("QEMU could not load trapline's plugin: {err}")
            } else {
                format!("QEMU failed during the replay: {err} (last event: {last})")
            };
            return Err(VmError::cannot_run(why));
        }
        let replayed = std::fs::read(&console).unwrap_or_default();
        if replayed != console_text {
            return Err(VmError::damaged(format!(
                "the replay diverged from its recording: {} (last event: {last})",
                console::first_difference(&console_text, &replayed)
            )));
        }
        if let Some(keep) = std::env::var_os("TRAPLINE_VM_KEEP_RAW") {
            // For debugging the plugin: its raw log, kept.
            let _ = std::fs::copy(&raw_path, &keep);
            let mut plan_copy = keep;
            plan_copy.push(".plan");
            let _ = std::fs::copy(&plan_path, plan_copy);
        }
        raw::check_complete(&raw)?;
        raws.push(raw);
    }
    if raws.len() == 2 && raw::events_part(&raws[0]) != raw::events_part(&raws[1]) {
        return Err(VmError::damaged(format!(
            "two replays of {} gave different events: {}",
            req.recording.display(),
            raw::first_difference(&raws[0], &raws[1])
        )));
    }
    let raw = raws.pop().expect("one replay at least");
    let kernel_map = kernel_symbols.as_ref().map(|text| {
        let mut p = req.output.clone().into_os_string();
        p.push(trapline_symbols::KERNEL_MAP_SUFFIX);
        (PathBuf::from(p), text.clone())
    });
    if let Some((path, text)) = &kernel_map {
        std::fs::write(path, text)
            .map_err(|e| VmError::usage(format!("{}: {e}", path.display())))?;
    }
    let converted = convert::convert(&convert::Input {
        raw: &raw,
        layout: &layout,
        plan: &plan,
        manifest: m,
        kernel_map: kernel_map.as_ref().map(|(p, _)| p.as_path()),
        kernel_symbols: kernel_symbols.as_deref(),
        output: &req.output,
        profile_hz: req.profile_hz,
    })?;
    Ok(ReplayOutcome {
        converted,
        manifest: rec.manifest.clone(),
        replay_seconds: seconds,
        raw_bytes: raw.len() as u64,
    })
}

/// Where trapline's QEMU plugin is, beside `exe` (the trapline binary).
pub fn plugin_beside(exe: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("TRAPLINE_VM_PLUGIN") {
        return PathBuf::from(p);
    }
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let here = dir.join(PLUGIN_FILE);
    if here.is_file() {
        return here;
    }
    dir.join("../lib/trapline").join(PLUGIN_FILE)
}

pub const PLUGIN_FILE: &str = "libtrapline_vm_plugin.so";
