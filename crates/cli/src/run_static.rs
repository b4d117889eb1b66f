//! `trapline run` of a statically linked program: no dynamic loader can
//! preload the agent into it, so it is recorded from outside
//! (`trapline_tracer`): ptrace, and detours of its allocator to stops.
//! Far slower per allocation than the agent, but the same trace.

use std::path::Path;
use std::process::ExitCode;

use nix::unistd::Pid;
use trapline_tracer::{Ended, Request};

use crate::run_args::{fail, RunArgs, EXIT_CANNOT_RUN};

/// What the outside recorder does not do (yet), by option.
fn unsupported(args: &RunArgs) -> Option<&'static str> {
    [
        (args.profile.is_some(), "--profile"),
        (args.record.is_some(), "--record"),
        (args.sample.is_some(), "--sample"),
        (args.production, "--production"),
        (
            args.control || args.watch.is_some(),
            "--control and --watch",
        ),
        (args.scan_every.is_some(), "--scan-every"),
        (args.scan_budget.is_some(), "--scan-budget"),
        (args.no_release_stacks, "--no-release-stacks"),
        (args.timeout.is_some(), "--timeout"),
    ]
    .into_iter()
    .find_map(|(given, name)| given.then_some(name))
}

pub fn main(args: &RunArgs, program: &Path, output: &Path) -> ExitCode {
    if let Some(option) = unsupported(args) {
        let _ = std::fs::remove_file(output);
        return fail(
            crate::args::EXIT_USAGE,
            format!(
                "{} is statically linked and recorded from outside, which does not support {option} yet",
                program.display()
            ),
        );
    }
    let file = match std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(output)
    {
        Ok(f) => f,
        Err(e) => {
            return fail(
                EXIT_CANNOT_RUN,
                format!("cannot write the trace {}: {e}", output.display()),
            )
        }
    };
    let self_exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return fail(EXIT_CANNOT_RUN, format!("cannot find trapline itself: {e}")),
    };
    let forwarding = match crate::run_signals::signal_forwarding() {
        Ok(f) => f,
        Err(code) => return code,
    };
    let mut forwarder = None;
    let request = Request {
        self_exe,
        program: program.to_path_buf(),
        argv: args.command.clone(),
        output: file,
        pass_invalid: args.pass_invalid_frees,
        scan: !args.no_scan,
    };
    let recorded = trapline_tracer::record(request, |pid| {
        forwarder = Some(crate::run_signals::forward_signals(
            forwarding,
            Pid::from_raw(pid as i32),
        ));
    });
    if let Some((handle, thread)) = forwarder {
        handle.close();
        let _ = thread.join();
    }
    let outcome = match recorded {
        Ok(o) => o,
        Err(e) => {
            let _ = std::fs::remove_file(output);
            return fail(EXIT_CANNOT_RUN, e);
        }
    };
    let (code, signal) = match outcome.ended {
        Ended::Code(c) => (c as u8, None),
        Ended::Signal(s) => (128u8.wrapping_add(s as u8), Some(s)),
    };
    if !args.quiet {
        for (name, why) in &outcome.refused {
            eprintln!("==trapline== {name} was not trapped: {why}");
        }
    }
    let found = (!args.quiet || args.error_exitcode.is_some())
        .then(|| {
            crate::run_summary::summarize_apart(output, program, outcome.pid, signal, !args.quiet)
                .found
        })
        .flatten();
    crate::run_summary::exit_status(code, args.error_exitcode, found)
}
