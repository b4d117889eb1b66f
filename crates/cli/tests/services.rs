//! Real Debian services under trapline, as a user runs them: nginx started
//! as root (a master and workers that drop privileges), memcached `-u
//! nobody`, redis-server with and without a watcher, and python3's
//! http.server attached to. Each is loaded on the
//! loopback with a bounded number of requests whose answers are checked,
//! and each ends with every process's trace complete and no allocation
//! error. `.ci/run` installs the packages; the tests run as root.

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits until something accepts on `port` (at most a minute).
fn until_listening(port: u16, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the service ended before it listened: {status}");
        }
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `trapline run` of a service and waits until it listens on `port`.
fn serving(mut cmd: Command, port: u16) -> Child {
    let mut run = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trapline run");
    until_listening(port, &mut run);
    run
}

/// Sends `signal` to process `pid`.
fn send(pid: u32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).expect("kill");
}

/// One HTTP/1.0 GET of `path`: the status line and the body.
fn http_get(port: u16, path: &str) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("the answer");
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("headers end");
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, answer[split + 4..].to_vec())
}

/// `count` GETs of `path`, each answered 200 with `body`.
fn load_http(port: u16, path: &str, body: &[u8], count: usize) {
    for i in 0..count {
        let (status, got) = http_get(port, path);
        assert!(status.contains(" 200 "), "request {i}: {status}");
        assert_eq!(got, body, "request {i}");
    }
}

/// The children of process `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            list.split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    out
}

/// A connection to `port`: a line reader and the writer.
fn line_connection(port: u16) -> (BufReader<TcpStream>, TcpStream) {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    (BufReader::new(stream.try_clone().unwrap()), stream)
}

/// The effective uid of process `pid`.
fn euid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse().ok())
        .unwrap()
}

fn trapline_output(args: &[&str]) -> Finished {
    let mut cmd = Command::new(trapline());
    cmd.args(args);
    output_of(cmd, &format!("trapline {}", args.join(" ")))
}

/// One look at process `pid` through `trapline watch`.
fn one_look(pid: u32) -> Value {
    let pid = pid.to_string();
    let w = trapline_output(&["watch", &pid, "--count", "1", "--format", "jsonl"]);
    assert_eq!(w.code(), 0, "{}", w.describe());
    serde_json::from_str(w.stdout.trim()).expect("one JSON look")
}

/// The report of `trace`: complete, nothing lost, no allocation error.
fn assert_clean(trace: &Path) -> Value {
    let report = leaks(trace);
    assert_complete(&report);
    assert_eq!(
        report["errors"].as_array().map(Vec::len),
        Some(0),
        "{}: {}",
        trace.display(),
        pretty(&report["errors"])
    );
    report
}

/// nginx started as root under `trapline run --control`: the master forks
/// two workers that change to nobody. Before, the workers hung in setgid
/// (the agent's threads blocked glibc's setxid signal) and only the master,
/// which does no work, could be watched. Each worker must answer, be
/// watched as root, and leave a complete trace; the master's QUIT ends the
/// run with status 0.
#[test]
fn nginx_as_root_with_workers_that_drop_privileges() {
    let dir = TestDir::new("nginx_root");
    let port = free_port();
    let prefix = dir.path().join("nginx");
    let www = prefix.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let body = b"served by nginx under trapline\n".repeat(40);
    std::fs::write(www.join("index.html"), &body).unwrap();
    let conf = prefix.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "user nobody nogroup;\nworker_processes 2;\ndaemon off;\npid {p}/nginx.pid;\n\
             error_log {p}/error.log;\nevents {{ worker_connections 64; }}\n\
             http {{\n access_log off;\n client_body_temp_path {p}/body;\n\
             proxy_temp_path {p}/proxy;\n fastcgi_temp_path {p}/fastcgi;\n\
             uwsgi_temp_path {p}/uwsgi;\n scgi_temp_path {p}/scgi;\n\
             server {{ listen 127.0.0.1:{port}; root {w}; }}\n}}\n",
            p = prefix.display(),
            w = www.display(),
        ),
    )
    .unwrap();
    let trace = dir.trace();
    let run = isolated(run_command(
        &dir,
        &["--control"],
        Path::new("/usr/sbin/nginx"),
        &[
            "-c",
            conf.to_str().unwrap(),
            "-p",
            prefix.to_str().unwrap(),
            "-e",
            "stderr",
        ],
    ));
    let run = serving(run, port);
    load_http(port, "/", &body, 200);
    let master = children(run.id())[0];
    let workers = children(master);
    assert_eq!(workers.len(), 2, "workers of {master}: {workers:?}");
    for &w in &workers {
        assert_eq!(euid(w), 65534, "worker {w}");
        let look = one_look(w);
        assert_eq!(look["pid"].as_u64(), Some(u64::from(w)));
    }
    load_http(port, "/", &body, 100);
    send(master, nix::sys::signal::Signal::SIGQUIT);
    let finished = finish(run, "trapline run nginx");
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    assert_clean(&trace);
    for w in workers {
        let mut worker_trace = trace.clone().into_os_string();
        worker_trace.push(format!(".{w}"));
        assert_clean(&PathBuf::from(worker_trace));
    }
}

/// memcached `-u nobody` under `trapline run --control`: it changes its
/// user in setgroups/setgid/setuid before it listens (it hung there) and
/// makes its socket as root before that. It must answer every set and get,
/// be watched as root through its socket, and end on SIGTERM with its trace
/// complete.
#[test]
fn memcached_as_nobody_under_control() {
    let dir = TestDir::new("memcached_nobody");
    let port = free_port();
    let trace = dir.trace();
    let run = isolated(run_command(
        &dir,
        &["--control"],
        Path::new("/usr/bin/memcached"),
        &[
            "-u",
            "nobody",
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-t",
            "2",
        ],
    ));
    let run = serving(run, port);
    let memcached = children(run.id())[0];
    assert_eq!(euid(memcached), 65534);
    let (mut reader, mut writer) = line_connection(port);
    let mut line = String::new();
    for i in 0..300 {
        let value = format!("value-{i}-{}", "x".repeat(i % 200));
        write!(writer, "set key{i} 0 0 {}\r\n{value}\r\n", value.len()).unwrap();
        line.clear();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "STORED\r\n", "set {i}");
    }
    for i in (0..300).step_by(7) {
        let value = format!("value-{i}-{}", "x".repeat(i % 200));
        write!(writer, "get key{i}\r\n").unwrap();
        let mut answer = Vec::new();
        for _ in 0..3 {
            line.clear();
            reader.read_line(&mut line).unwrap();
            answer.push(line.clone());
        }
        assert_eq!(
            answer,
            [
                format!("VALUE key{i} 0 {}\r\n", value.len()),
                format!("{value}\r\n"),
                "END\r\n".to_string()
            ]
        );
    }
    let look = one_look(memcached);
    assert_eq!(look["pid"].as_u64(), Some(u64::from(memcached)));
    assert!(look["live_blocks"].as_u64().unwrap() > 0, "{look}");
    drop(writer);
    send(memcached, nix::sys::signal::Signal::SIGTERM);
    let finished = finish(run, "trapline run memcached");
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    assert_clean(&trace);
}

/// Debian's python3 -m http.server, attached to while it serves and
/// detached from: every answer right before, during and after, and the
/// attached trace complete with no allocation error (it once reported the
/// loader's releases of thread vectors as double frees).
#[test]
fn python_http_server_attached_and_detached() {
    let dir = TestDir::new("python_http");
    let port = free_port();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    let body = b"served by python under trapline attach\n".repeat(20);
    std::fs::write(root.join("page.txt"), &body).unwrap();
    let mut server = Command::new("/usr/bin/python3")
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(&root)
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start python3");
    until_listening(port, &mut server);
    load_http(port, "/page.txt", &body, 20);
    let pid = server.id().to_string();
    let trace = dir.path().join("attached.trace");
    let a = trapline_output(&["attach", &pid, "-o", trace.to_str().unwrap()]);
    assert_eq!(a.code(), 0, "{}", a.describe());
    load_http(port, "/page.txt", &body, 100);
    let d = trapline_output(&["detach", &pid]);
    assert_eq!(d.code(), 0, "{}", d.describe());
    load_http(port, "/page.txt", &body, 20);
    server.kill().unwrap();
    server.wait().unwrap();
    let report = assert_clean(&trace);
    assert_eq!(
        report["process"]["pid"].as_u64(),
        Some(u64::from(server.id()))
    );
}

/// One RESP command to redis and its one-line (or bulk) answer.
fn redis_command(
    writer: &mut TcpStream,
    reader: &mut BufReader<TcpStream>,
    args: &[&str],
) -> String {
    let mut request = format!("*{}\r\n", args.len());
    for a in args {
        request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    writer.write_all(request.as_bytes()).unwrap();
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    if line.starts_with('$') && line != "$-1\r\n" {
        let mut value = String::new();
        reader.read_line(&mut value).unwrap();
        line.push_str(&value);
    }
    line
}

/// Debian's redis-server (on jemalloc, from its own library) under `run
/// --control` and under `run --watch`, each given the same 400 SETs and
/// GETs: every answer right, the run's status 0 after SIGTERM, the traces
/// complete with no allocation error, nothing lost, and the same verdicts
/// with the watcher as without it (watching once changed them). The
/// watcher names no site growing or stale: a keyspace filled once is not
/// a leak (it once called redis's latency histograms growing).
#[test]
fn redis_under_control_and_under_watch_judged_alike() {
    let mut verdicts = Vec::new();
    for flags in [&["--control"][..], &["--watch=0.2"][..]] {
        let dir = TestDir::new("redis");
        let port = free_port();
        let trace = dir.trace();
        let run = isolated(run_command(
            &dir,
            flags,
            Path::new("/usr/bin/redis-server"),
            &[
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
        ));
        let run = serving(run, port);
        let (mut reader, mut writer) = line_connection(port);
        for i in 0..400 {
            let value = format!("value-{i}-{}", "y".repeat(i % 300));
            let key = format!("key{i}");
            let set = redis_command(&mut writer, &mut reader, &["SET", &key, &value]);
            assert_eq!(set, "+OK\r\n", "set {i}");
        }
        for i in (0..400).step_by(3) {
            let value = format!("value-{i}-{}", "y".repeat(i % 300));
            let got = redis_command(&mut writer, &mut reader, &["GET", &format!("key{i}")]);
            assert_eq!(got, format!("${}\r\n{value}\r\n", value.len()), "get {i}");
        }
        drop(writer);
        send(run.id(), nix::sys::signal::Signal::SIGTERM);
        let finished = finish(run, "trapline run redis-server");
        assert_eq!(finished.code(), 0, "{flags:?}: {}", finished.describe());
        let report = assert_clean(&trace);
        let kind = |k: &str| {
            let s = &report["summary"][k];
            (s["bytes"].as_u64(), s["blocks"].as_u64())
        };
        assert_eq!(kind("definitely_lost"), (Some(0), Some(0)), "{flags:?}");
        verdicts.push((kind("definitely_lost"), kind("indirectly_lost")));
        if flags[0].starts_with("--watch") {
            assert!(
                finished.stderr.contains("==trapline== watch: "),
                "{}",
                finished.stderr
            );
            for verdict in ["growing at the last look", "stale at the last look"] {
                assert!(!finished.stderr.contains(verdict), "{}", finished.stderr);
            }
        }
    }
    assert_eq!(verdicts[0], verdicts[1], "with and without the watcher");
}
