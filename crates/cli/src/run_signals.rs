//! The signals trapline gets while the command runs: passed on to the
//! command, swallowed, or left ignored as trapline inherited them.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::process::ExitCode;

use crate::run_args::{fail, EXIT_CANNOT_RUN};

/// Signals sent to trapline while the command runs.
pub(crate) struct Forwarding {
    signals: signal_hook::iterator::Signals,
}

/// The signals meant for the command, caught before it starts.
pub(crate) fn signal_forwarding() -> Result<Forwarding, ExitCode> {
    // While the command runs, signals meant for it must not kill trapline
    // first: a terminal's SIGINT/SIGQUIT reach the whole process group anyway;
    // SIGTERM, SIGHUP and the user signals sent to trapline are passed on.
    let swallowed = [signal_hook::consts::SIGINT, signal_hook::consts::SIGQUIT];
    // A signal trapline was started with ignored stays ignored, so that the
    // command inherits it ignored as it would natively (`nohup`; a shell's
    // background job ignores SIGINT and SIGQUIT): a handler here would
    // become SIG_DFL in the command at exec, and `nohup trapline run --
    // server` died of the SIGHUP it was meant to survive.
    let ignored = ignored_signals();
    let caught: Vec<i32> = FORWARDED
        .iter()
        .chain(swallowed.iter())
        .copied()
        .filter(|&sig| ignored & (1 << (sig - 1)) == 0)
        .collect();
    signal_hook::iterator::Signals::new(&caught)
        .map(|signals| Forwarding { signals })
        .map_err(|e| {
            fail(
                EXIT_CANNOT_RUN,
                format!("cannot set up signal forwarding: {e}"),
            )
        })
}

/// SIGTERM, SIGHUP and the user signals trapline gets go on to the command
/// `child` (SIGINT and SIGQUIT are swallowed: a terminal sends them to the
/// whole process group anyway). Close the handle, then join the thread.
pub(crate) fn forward_signals(
    mut f: Forwarding,
    child: Pid,
) -> (signal_hook::iterator::Handle, std::thread::JoinHandle<()>) {
    let handle = f.signals.handle();
    let forwarder = std::thread::spawn(move || {
        for sig in f.signals.forever() {
            if FORWARDED.contains(&sig) {
                if let Ok(s) = Signal::try_from(sig) {
                    let _ = kill(child, s);
                }
            }
        }
    });
    (handle, forwarder)
}

const FORWARDED: [i32; 4] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGUSR1,
    signal_hook::consts::SIGUSR2,
];

/// Set before `main` by the C constructor of `csrc/inherited_sigpipe.c`:
/// "ignored" when trapline was started with SIGPIPE ignored.
pub(crate) const INHERITED_SIGPIPE: &str = "TRAPLINE_INHERITED_SIGPIPE";

/// The signals this process ignores (bit N-1 for signal N), from
/// `/proc/self/status`: what it inherited, except SIGPIPE, which Rust's
/// runtime ignores before `main` (and resets to the default for the
/// command it spawns; `INHERITED_SIGPIPE` says what it was).
fn ignored_signals() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(0)
}
