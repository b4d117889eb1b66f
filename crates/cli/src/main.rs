//! `trapline`: record a program's allocations, locks and CPU samples, then analyse the trace.

#![forbid(unsafe_code)]

mod args;
mod attach;
mod attach_window;
mod control_client;
mod deadlocks;
mod diff;
mod embedded_agent;
mod export;
mod inject;
mod leaks;
mod locks;
mod output;
mod profile;
mod progress;
mod report;
mod run;
mod run_args;
mod run_signals;
mod run_static;
mod run_summary;
mod stats;
mod trace_names;
mod trace_output;
mod vm;
mod watch;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "trapline",
    version,
    about = "Diagnose native programs while they run: leaks, allocation errors, locks, CPU."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// A function that only passes allocations on to the allocator (as
    /// memcheck's --alloc-fn): sites are named by their first frame
    /// outside such wrappers, which stay in the stacks. A trailing `*`
    /// names a prefix; may be repeated. redis's zmalloc family, nginx's
    /// ngx_alloc, glib's g_malloc and other common ones are known.
    #[arg(long = "alloc-fn", value_name = "NAME", global = true)]
    alloc_fn: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command with the agent preloaded and record a trace.
    Run(run_args::RunArgs),
    /// Record a process that is already running, from now on.
    Attach(attach::AttachArgs),
    /// End the recording `attach` started; the process goes on as before.
    Detach(attach::DetachArgs),
    /// Report the blocks still allocated at exit and the allocation errors.
    Leaks(leaks::LeaksArgs),
    /// Allocation statistics: calls per function, bytes, peak heap, trace size.
    Stats(stats::StatsArgs),
    /// CPU profile from a trace recorded with `run --profile`: functions, threads, flame graph.
    Profile(profile::ProfileArgs),
    /// Lock contention: acquisitions, contended acquisitions, owner changes, wait and hold times per lock.
    Locks(locks::LocksArgs),
    /// Potential deadlocks (lock-order cycles), actual deadlocks and lock misuse.
    Deadlocks(deadlocks::DeadlocksArgs),
    /// Compare two runs per allocation site: calls, bytes allocated, live bytes at the end.
    Diff(diff::DiffArgs),
    /// One self-contained HTML page of a run's traces: heap over time, leaks, flame graphs, locks.
    Report(report::ReportArgs),
    /// Write a trace's analyses in a format other tools read (pprof).
    Export(export::ExportArgs),
    /// Watch a process started with `run --control`: live bytes per
    /// allocation site, and the sites that keep growing, while it runs.
    Watch(watch::WatchArgs),
    /// Record a program in a QEMU guest and replay it with trapline's
    /// plugin: the guest kernel's allocations too.
    Vm(vm::VmArgs),
}

fn main() -> ExitCode {
    // The helper that starts a static program traced (run_static):
    // `trapline __trapline-traceme PROGRAM -- ARGV0 ARGS...`.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.len() >= 4 && argv[1] == trapline_tracer::TRACEME_ARG && argv[3] == "--" {
        trapline_tracer::traceme_and_exec(std::path::Path::new(&argv[2]), &argv[4..]);
    }
    // The reader of a run's traces, apart from `trapline run` (run_summary).
    if argv.len() >= 2 && argv[1] == run_summary::READER_ARG {
        return run_summary::reader_main(&argv[2..]);
    }
    let cli = Cli::parse();
    trapline_analysis::report::set_allocation_wrappers(cli.alloc_fn);
    match cli.command {
        Command::Run(args) => run::main(args),
        Command::Attach(args) => attach::attach(args),
        Command::Detach(args) => attach::detach(args),
        Command::Leaks(args) => leaks::main(args),
        Command::Stats(args) => stats::main(args),
        Command::Profile(args) => profile::main(args),
        Command::Locks(args) => locks::main(args),
        Command::Deadlocks(args) => deadlocks::main(args),
        Command::Watch(args) => watch::main(args),
        Command::Export(args) => export::main(args),
        Command::Diff(args) => diff::main(args),
        Command::Report(args) => report::main(args),
        Command::Vm(args) => vm::main(args),
    }
}
