//! `trapline vm record` and `trapline vm replay`: whole-system record and
//! replay of a program in a QEMU guest (crates/vm).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use trapline_vm::{RecordRequest, ReplayRequest, VmError};

#[derive(clap::Args, Debug)]
pub struct VmArgs {
    #[command(subcommand)]
    command: VmCommand,
}

#[derive(clap::Subcommand, Debug)]
enum VmCommand {
    /// Boot a small Linux guest under QEMU with record/replay on, run
    /// CMD in it and record everything it did (exit status: CMD's).
    Record(RecordArgs),
    /// Replay a recording with trapline's QEMU plugin and write a trace
    /// that `leaks`, `stats` and the other analyses read.
    Replay(ReplayArgs),
}

#[derive(clap::Args, Debug)]
struct RecordArgs {
    /// The recording's directory (must not exist, or be empty).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Also dump the guest kernel's symbols, so that a replay can trap its
    /// allocator (kmalloc, kmem_cache_alloc, vmalloc and their frees).
    #[arg(long)]
    kernel_allocs: bool,
    /// The guest kernel (default: the newest /boot/vmlinuz-*).
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// A kernel module to load in the guest before CMD runs (repeatable).
    #[arg(long = "kernel-module", value_name = "KO")]
    modules: Vec<PathBuf>,
    /// Another file, or a directory with all it holds, to carry into the
    /// guest at the same path (repeatable). CMD starts in the current
    /// directory, and its arguments that name files are carried without
    /// --file.
    #[arg(long = "file", value_name = "PATH")]
    files: Vec<PathBuf>,
    /// The guest's memory, which also holds every file carried in.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    memory: u32,
    /// Stop CMD after this many seconds of the guest's time (its clock is
    /// the instruction count; idle time passes at once) with SIGTERM, and
    /// SIGKILL 10 s later if it is still running, as `trapline run
    /// --timeout` does; the recording is kept and can be replayed. Exit
    /// status 124 then. A guest that does not power off within 10 times
    /// SECONDS of wall time plus 2 minutes is stopped from the host.
    #[arg(long, value_name = "SECONDS", value_parser = crate::run_args::parse_seconds)]
    timeout: Option<f64>,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

#[derive(clap::Args, Debug)]
struct ReplayArgs {
    /// The recording's directory, written by `trapline vm record`.
    recording: PathBuf,
    /// The trace to write.
    #[arg(short = 'o', long = "output", default_value = "trapline.trace")]
    output: PathBuf,
    /// Replay twice and fail unless both give the same events.
    #[arg(long)]
    verify: bool,
    /// Bytes of the program's stack copied at each trapped call, from which
    /// its call stack is unwound.
    #[arg(long, default_value_t = 4096, value_name = "BYTES")]
    stack_bytes: usize,
    /// Sample the traced process's CPU use with call stacks, HZ times per
    /// second of the guest's clock while it runs (default 999), as
    /// `trapline run --profile` samples CPU time; see `trapline profile`.
    /// A sample falls at the first block of guest code entered after
    /// each period's instructions, so two replays sample alike.
    #[arg(
        long,
        value_name = "HZ",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = crate::run_args::DEFAULT_PROFILE_HZ_TEXT,
        value_parser = clap::value_parser!(u32).range(1..=100_000)
    )]
    profile: Option<u32>,
    /// Replace TRACE even when it is a file that is not a trapline trace.
    #[arg(long)]
    force: bool,
    /// Stop the replay (and fail, exit 124) after this many seconds
    /// (default: 30 times the recording's time, plus 2 minutes).
    #[arg(long, value_name = "SECONDS", value_parser = crate::run_args::parse_seconds)]
    timeout: Option<f64>,
}

fn fail(command: &str, e: VmError) -> ExitCode {
    eprintln!("trapline vm {command}: {}", e.message);
    ExitCode::from(e.exit_code)
}

pub fn main(args: VmArgs) -> ExitCode {
    match args.command {
        VmCommand::Record(a) => record(a),
        VmCommand::Replay(a) => replay(a),
    }
}

fn record(a: RecordArgs) -> ExitCode {
    let program = match crate::run::find_command(&a.command[0]) {
        Ok(p) => std::fs::canonicalize(&p).unwrap_or(p),
        Err((code, msg)) => {
            return fail(
                "record",
                VmError {
                    message: msg,
                    exit_code: code,
                },
            )
        }
    };
    let cwd = match std::env::current_dir() {
        Ok(d) => d,
        Err(e) => {
            return fail(
                "record",
                VmError::usage(format!("the current directory: {e}")),
            )
        }
    };
    let files = a
        .files
        .iter()
        .map(|f| trapline_vm::guest::absolute(f, &cwd))
        .collect();
    let req = RecordRequest {
        output: a.output.clone(),
        program,
        argv: a
            .command
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect(),
        kernel: a.kernel,
        kernel_allocs: a.kernel_allocs,
        files,
        modules: absolute(a.modules),
        cwd,
        memory_mb: a.memory,
        timeout: a.timeout.map(Duration::from_secs_f64),
        warn: |w| eprintln!("==trapline== warning: {w}"),
    };
    match trapline_vm::record(&req) {
        Ok(done) => {
            use std::io::Write;
            let _ = std::io::stdout().write_all(&done.stdout);
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().write_all(&done.stderr);
            let m = &done.manifest;
            eprintln!(
                "==trapline== recorded {} in a guest: {:.1} s, {} bytes of replay log; exit status {}",
                a.output.display(),
                m.record_seconds,
                m.replay_log_bytes,
                m.exit_status
            );
            eprintln!(
                "==trapline== next: trapline vm replay {} -o TRACE",
                a.output.display()
            );
            if !done.stopped.is_empty() {
                eprintln!(
                    "==trapline== the command was stopped by --timeout after {} s of guest time ({}); the recording is complete: replay it (if it hung on a lock, see trapline deadlocks TRACE)",
                    a.timeout.unwrap_or_default(),
                    done.stopped
                        .iter()
                        .map(|s| format!("SIG{s}"))
                        .collect::<Vec<_>>()
                        .join(", then ")
                );
                return ExitCode::from(trapline_vm::EXIT_TIMED_OUT);
            }
            ExitCode::from((m.exit_status & 0xff) as u8)
        }
        Err(e) => fail("record", e),
    }
}

fn absolute(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths
        .into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect()
}

fn replay(a: ReplayArgs) -> ExitCode {
    if let Ok(meta) = std::fs::symlink_metadata(&a.output) {
        let usage = |message: String| fail("replay", VmError::usage(message));
        if meta.file_type().is_symlink() || meta.is_dir() {
            return usage(format!(
                "{} is a symbolic link or a directory: give a trace file",
                a.output.display()
            ));
        }
        if !a.force && !crate::trace_output::is_trace_or_empty(&a.output) {
            return usage(format!(
                "{} exists and is not a trapline trace: refusing to overwrite it (--force replaces it)",
                a.output.display()
            ));
        }
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let req = ReplayRequest {
        recording: a.recording.clone(),
        output: a.output.clone(),
        plugin: trapline_vm::plugin_beside(&exe),
        timeout: a.timeout.map(Duration::from_secs_f64),
        verify: a.verify,
        stack_bytes: a.stack_bytes,
        profile_hz: a.profile,
    };
    match trapline_vm::replay(&req) {
        Ok(done) => {
            let c = &done.converted;
            let times: Vec<String> = done
                .replay_seconds
                .iter()
                .map(|s| format!("{s:.1} s"))
                .collect();
            eprintln!(
                "==trapline== replayed {} ({}{}): {} allocations, {} releases, {} errors; kernel: {} allocations, {} releases; {} blocks ({} bytes) live at the end; {} guest instructions",
                a.recording.display(),
                times.join(", "),
                if a.verify { ", both replays identical" } else { "" },
                c.allocations,
                c.releases,
                c.errors,
                c.kernel_allocations,
                c.kernel_releases,
                c.live_blocks,
                c.live_bytes,
                c.guest_instructions
            );
            if a.profile.is_some() {
                eprintln!("==trapline== {} CPU samples", c.samples);
            }
            if let Some(secs) = done.manifest.stopped_after_seconds {
                eprintln!(
                    "==trapline== the command was stopped by --timeout after {secs} s of guest time (exit status {})",
                    done.manifest.exit_status
                );
            }
            eprintln!("==trapline== trace: {}", a.output.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail("replay", e),
    }
}
