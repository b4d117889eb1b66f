//! `trapline attach PID` and `trapline detach PID`: record a process that
//! is already running, from now on, and stop.
//!
//! Attaching loads the agent into the process through one of its threads
//! (`inject`): a call to the C library's `dlopen`, which runs nothing of
//! the agent's but its idle constructor, then to the agent's entry point
//! with the options, which opens the trace, starts the agent's threads and
//! points the program's import slots at the hooks. Detaching asks the
//! agent, through its control socket, to put every slot back and end the
//! trace; the library stays loaded and idle.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use object::{Object, ObjectSegment, ObjectSymbol};
use trapline_contract::{control, env};

use crate::control_client::{ask, fail, run_for};
use crate::inject;

#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    /// The process to record.
    pub pid: u32,
    /// The trace to write (default trapline-PID.trace); the process
    /// writes it, so its user must be able to.
    #[arg(short = 'o', long = "output", value_name = "TRACE")]
    pub output: Option<PathBuf>,
    /// Detach after SECS seconds (without it, `trapline detach PID` ends
    /// the recording, or the process's end does).
    #[arg(long, value_name = "SECS", value_parser = crate::output::parse_seconds)]
    pub duration: Option<f64>,
    /// What to record: `mem`, `locks` or both (default), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub record: Option<Vec<String>>,
    /// Sampled recording: only about one allocation per BYTES allocated
    /// takes its full stack (default 512K), as `trapline run --sample`.
    #[arg(long, value_name = "BYTES", num_args = 0..=1, default_missing_value = "524288")]
    pub sample: Option<u64>,
    /// Production mode, as `trapline run --production`: only the sampled
    /// allocations are recorded; every call is counted by function.
    #[arg(long, conflicts_with = "record")]
    pub production: bool,
    /// Replace TRACE if it exists.
    #[arg(long)]
    pub force: bool,
}

#[derive(clap::Args, Debug)]
pub struct DetachArgs {
    /// The process `trapline attach` attached to.
    pub pid: u32,
}

pub fn attach(args: AttachArgs) -> ExitCode {
    let pid = args.pid;
    if crate::attach_window::recorded_with_control(pid) {
        if args.record.is_some() || args.sample.is_some() || args.production {
            return fail(
                "attach",
                format!(
                    "process {pid} is recorded by `trapline run` already: its window is cut \
                     from that recording, whose --record and --sample stand"
                ),
            );
        }
        return crate::attach_window::attach(pid, args.output, args.duration, args.force);
    }
    if let Err(why) = check_target(pid) {
        return fail("attach", why);
    }
    let agent = match crate::run::find_agent() {
        Ok(a) => a,
        Err(e) => return fail("attach", e),
    };
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("trapline-{pid}.trace")));
    let output = std::path::absolute(&output).unwrap_or(output);
    let dir = output.parent().unwrap_or(Path::new("/"));
    if let Some(user) = target_user(pid).filter(|u| !may_write_in(u, dir)) {
        return fail(
            "attach",
            format!(
                "{}: process {pid} (user {}) cannot make its trace there; \
                 -o names a directory that user may write (nothing was changed)",
                output.display(),
                user.uid
            ),
        );
    }
    if output.exists() && !args.force {
        return fail(
            "attach",
            format!(
                "{}: exists; --force replaces it (nothing was changed)",
                output.display()
            ),
        );
    }
    let (dir, socket) = crate::watch::socket_of(pid);
    let mut options = vec![format!("{}={}", env::OUTPUT, output.display())];
    // The caller's own directory when the process is the caller's user's;
    // else the agent makes its user's (root can enter it, and `watch` and
    // `detach` find the socket wherever it is).
    if target_user(pid).is_some_and(|u| u.uid == nix::unistd::geteuid().as_raw()) {
        options.push(format!("{}={dir}", env::CONTROL_DIR));
    }
    if let Some(list) = &args.record {
        if let Some(bad) = list
            .iter()
            .find(|r| ![env::RECORD_MEMORY, env::RECORD_LOCKS].contains(&r.as_str()))
        {
            eprintln!(
                "trapline attach: --record {bad}: attach records mem and locks (no CPU samples)"
            );
            return ExitCode::from(crate::args::EXIT_USAGE);
        }
        options.push(format!("{}={}", env::RECORD, list.join(",")));
    }
    if let Some(bytes) = args.sample {
        options.push(format!("{}={bytes}", env::SAMPLE_BYTES));
    }
    if args.production {
        options.push(format!("{}=1", env::PRODUCTION));
    }
    let agent = match target_user(pid).map(|u| agent_for(&u, &agent)) {
        Some(Ok(a)) => a,
        Some(Err(why)) => return fail("attach", format!("the agent for process {pid}: {why}")),
        None => agent,
    };
    if let Err(why) = load_agent(pid, &agent, &options.join("\n")) {
        return fail("attach", format!("process {pid}: {why}"));
    }
    eprintln!(
        "trapline attach: recording process {pid} into {}; `trapline detach {pid}` ends it",
        output.display()
    );
    let Some(secs) = args.duration else {
        return ExitCode::SUCCESS;
    };
    if !run_for(pid, secs) {
        eprintln!(
            "trapline attach: process {pid} ended while attached; its trace ends with its \
             exit: trapline leaks {}",
            output.display()
        );
        return ExitCode::SUCCESS;
    }
    match ask_detach(pid, &socket) {
        Ok(slots) => {
            eprintln!(
                "trapline attach: detached from process {pid} after {secs} s ({slots} import slots put back); see: trapline leaks {}",
                output.display()
            );
            ExitCode::SUCCESS
        }
        Err(why) => fail("attach", format!("process {pid}: {why}")),
    }
}

pub fn detach(args: DetachArgs) -> ExitCode {
    if let Some(code) = crate::attach_window::detach(args.pid) {
        return code;
    }
    let (_, socket) = crate::watch::socket_of(args.pid);
    match ask_detach(args.pid, &socket) {
        Ok(slots) => {
            eprintln!(
                "trapline detach: detached from process {} ({slots} import slots put back)",
                args.pid
            );
            ExitCode::SUCCESS
        }
        Err(why) => fail("detach", format!("process {}: {why}", args.pid)),
    }
}

/// What keeps `pid` from being attached to, checked before anything
/// touches it.
/// The effective user and groups of a process (/proc/PID/status).
struct TargetUser {
    uid: u32,
    gids: Vec<u32>,
}

fn target_user(pid: u32) -> Option<TargetUser> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ids = |key: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|u| u.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let uid = *ids("Uid:").get(1)?;
    let mut gids = ids("Groups:");
    gids.extend(ids("Gid:").get(1));
    Some(TargetUser { uid, gids })
}

/// Whether `user` has the `rwx` bits `want` (0o4 read, 0o2 write, 0o1
/// search) on `path` by its mode bits.
fn permits(user: &TargetUser, path: &Path, want: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(path) else {
        return false;
    };
    let bits = if m.uid() == user.uid {
        m.mode() >> 6
    } else if user.gids.contains(&m.gid()) {
        m.mode() >> 3
    } else {
        m.mode()
    };
    user.uid == 0 || bits & want == want
}

/// Whether `user` may reach `path`: search on every directory above it.
fn may_reach(user: &TargetUser, path: &Path) -> bool {
    path.ancestors().skip(1).all(|d| permits(user, d, 0o1))
}

/// Whether process `pid`'s user may make a file in `dir` (by its mode
/// bits: the process writes the trace itself, and a refusal found only
/// after the agent is in is a worse error).
fn may_write_in(user: &TargetUser, dir: &Path) -> bool {
    may_reach(user, dir) && permits(user, dir, 0o3)
}

/// The agent as the target's user can open it: where it is, or else a copy
/// in a directory of the caller's that everyone may read but only the
/// caller write (root's agent in /root, a worker running as nobody).
fn agent_for(user: &TargetUser, agent: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if may_reach(user, agent) && permits(user, agent, 0o4) {
        return Ok(agent.to_path_buf());
    }
    let me = nix::unistd::geteuid().as_raw();
    let dir = PathBuf::from(format!("/tmp/trapline-agents-{me}"));
    let _ = std::fs::create_dir(&dir);
    let m = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.is_dir() || m.uid() != me || m.mode() & 0o022 != 0 {
        return Err(format!(
            "{}: not a directory of this user's that only it may write",
            dir.display()
        ));
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let bytes = std::fs::read(agent).map_err(|e| format!("{}: {e}", agent.display()))?;
    let digest = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let copy = dir.join(format!("libtrapline_agent-{digest:016x}.so"));
    if !copy.exists() {
        let part = dir.join(format!(".{}.part", std::process::id()));
        std::fs::write(&part, &bytes)
            .and_then(|()| std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o644)))
            .and_then(|()| std::fs::rename(&part, &copy))
            .map_err(|e| format!("{}: {e}", copy.display()))?;
    }
    Ok(copy)
}

fn check_target(pid: u32) -> Result<(), String> {
    let user = target_user(pid).ok_or_else(|| format!("no process {pid}"))?;
    let uid = user.uid;
    let me = nix::unistd::geteuid().as_raw();
    if me != 0 && me != uid {
        return Err(format!(
            "process {pid} belongs to user {uid}: attach as that user or as root"
        ));
    }
    if pid == std::process::id() {
        return Err("that is trapline itself".into());
    }
    if is_kernel_thread(pid) {
        return Err(format!(
            "process {pid} is a kernel thread: it runs no program to attach to"
        ));
    }
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    match scope {
        3 => {
            return Err(
                "the kernel forbids attaching to processes (kernel.yama.ptrace_scope = 3, which \
                 only a reboot undoes)"
                    .into(),
            )
        }
        2 if me != 0 => {
            return Err(
                "only root may attach here (kernel.yama.ptrace_scope = 2): run as root".into(),
            )
        }
        1 if me != 0 => {
            return Err(
                "this kernel lets a process attach only to its own descendants \
                        (kernel.yama.ptrace_scope = 1): run as root, or `sysctl \
                        kernel.yama.ptrace_scope=0`"
                    .to_string(),
            )
        }
        _ => {}
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| format!("cannot read /proc/{pid}/maps: {e}"))?;
    // An agent that is in but serves no socket may be idle after a failed
    // attach, which the next one takes up again; the agent says otherwise.
    if maps.lines().any(|l| env::names_agent(l.as_bytes()))
        && crate::watch::served_socket(pid).is_some()
    {
        return Err(format!(
            "process {pid} is recorded already (attached to): `trapline watch {pid}` looks \
             at it, `trapline detach {pid}` ends the attach"
        ));
    }
    if libc_mapping(&maps).is_none() {
        return Err(format!(
            "process {pid} has no C library loaded (a static program, or not glibc's): \
             attaching needs its dlopen"
        ));
    }
    Ok(())
}

/// Whether `pid` is a kernel thread (`PF_KTHREAD` in the flags of
/// `/proc/PID/stat`, the 9th field).
fn is_kernel_thread(pid: u32) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.split_whitespace().nth(6)?.parse::<u64>().ok()
        })
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// The C library's file and the address it is mapped at (its mapping of
/// file offset 0).
fn libc_mapping(maps: &str) -> Option<(String, u64)> {
    maps.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let path = *f.get(5)?;
        let name = path.rsplit('/').next()?;
        if !(name.starts_with("libc.so.6") || name.starts_with("libc-2.")) || f[2] != "00000000" {
            return None;
        }
        let start = u64::from_str_radix(f[0].split('-').next()?, 16).ok()?;
        Some((path.to_string(), start))
    })
}

/// The addresses of the C library's `dlopen`, `dlsym` and `dlerror` in
/// process `pid`, from its file (seen through the process's root).
fn loader_functions(pid: u32) -> Result<[u64; 3], String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| e.to_string())?;
    let (path, start) = libc_mapping(&maps).ok_or("no C library mapped")?;
    let file = format!("/proc/{pid}/root{path}");
    let data = std::fs::read(&file).map_err(|e| format!("cannot read {path}: {e}"))?;
    let elf = object::File::parse(&*data).map_err(|e| format!("{path}: {e}"))?;
    let first = elf.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    let find = |name: &str| {
        elf.dynamic_symbols()
            .find(|s| s.name() == Ok(name) && s.address() != 0)
            .map(|s| start + s.address() - first)
            .ok_or_else(|| format!("{path} defines no {name} (glibc 2.34 or later is needed)"))
    };
    Ok([find("dlopen")?, find("dlsym")?, find("dlerror")?])
}

/// Loads the agent into `pid` and starts it with `options`.
fn load_agent(pid: u32, agent: &Path, options: &str) -> Result<(), String> {
    let [dlopen, dlsym, dlerror] = loader_functions(pid)?;
    let mut thread = inject::stop_a_waiting_thread(pid, 100, Duration::from_millis(20))?;
    let c = |s: &str| {
        let mut b = s.as_bytes().to_vec();
        b.push(0);
        b
    };
    let path = thread.push_bytes(&c(&agent.to_string_lossy()))?;
    let entry_name = thread.push_bytes(&c(env::ATTACH_ENTRY))?;
    let options = thread.push_bytes(&c(options))?;
    const ERROR_LEN: usize = 1024;
    let error = thread.push_bytes(&[0u8; ERROR_LEN])?;
    let read_c = |thread: &inject::Stopped, at: u64| -> String {
        let bytes = thread.read_bytes(at, ERROR_LEN).unwrap_or_default();
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    };
    let handle = thread.call(dlopen, &[path, libc::RTLD_NOW as u64])?;
    if handle == 0 {
        let message = thread.call(dlerror, &[])?;
        let why = if message == 0 {
            String::new()
        } else {
            read_c(&thread, message)
        };
        thread.release()?;
        return Err(format!("its dlopen refused the agent: {why}"));
    }
    let entry = thread.call(dlsym, &[handle, entry_name])?;
    if entry == 0 {
        thread.release()?;
        return Err(format!(
            "{} has no {} (another build of the agent?)",
            agent.display(),
            env::ATTACH_ENTRY
        ));
    }
    let status = thread.call(entry, &[options, error, ERROR_LEN as u64])?;
    let why = read_c(&thread, error);
    thread.release()?;
    if status as u32 != 0 {
        return Err(format!("the agent could not start: {why}"));
    }
    Ok(())
}

/// Asks the agent of `pid` to detach; the slots it put back.
fn ask_detach(pid: u32, socket: &str) -> Result<u64, String> {
    let answer = ask(pid, socket, control::DETACH)?;
    answer["slots"]
        .as_u64()
        .ok_or_else(|| format!("unexpected answer {answer}"))
}
