//! `trapline watch PID`: the policy half of watching a running program.
//!
//! The agent of a process started with `trapline run --control` answers on
//! its control socket (the mechanism: crates/agent services/control.rs).
//! This process asks it, every interval, for the live bytes of each
//! allocation site, keeps each site's series, and judges which sites keep
//! growing with the estimator `trapline leaks` uses (trapline-analysis's
//! `growth`). It names the sites from the trace the agent is writing. A
//! watcher that stops, or is killed, leaves the program as it was: it can
//! be started again at any time.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use trapline_analysis::growth::{judge, Growth};
use trapline_analysis::report::{frame_text, thousands, FrameReport};
use trapline_contract::control;

#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// The process to watch, started with `trapline run --control`.
    pub pid: u32,
    /// Seconds between two looks.
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_seconds)]
    pub interval: f64,
    /// Looks to take before stopping (default: until the process ends).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub count: Option<u32>,
    /// Sites listed at each look, largest first (growing sites always are).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Output: a table that refreshes in place on a terminal (text), or
    /// one JSON object per look (jsonl).
    #[arg(long, value_enum, default_value_t = WatchFormat::Text)]
    pub format: WatchFormat,
    /// Wait up to SECS seconds for the process's socket to appear (a
    /// process just started).
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub wait: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WatchFormat {
    Text,
    Jsonl,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.01 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds (at least 0.01)")),
    }
}

/// One look's line of `--format jsonl`.
#[derive(Serialize)]
struct Look<'a> {
    pid: u32,
    /// Seconds since the first look.
    time_seconds: f64,
    /// Looks so far.
    looks: usize,
    live_bytes: u64,
    live_blocks: u64,
    sites: Vec<SiteLook<'a>>,
}

#[derive(Serialize)]
struct SiteLook<'a> {
    stack_id: u32,
    allocated_by: &'a str,
    bytes: u64,
    blocks: u64,
    /// Why the site is judged growing, or null.
    growth: Option<Growth>,
    /// The allocation stack (empty until the agent has written it).
    stack: &'a [FrameReport],
}

type Site = (u32, String);

struct Watcher {
    pid: u32,
    trace: Option<PathBuf>,
    times: Vec<f64>,
    series: HashMap<Site, Vec<u64>>,
    /// Bytes and blocks of each site at the last look.
    current: HashMap<Site, (u64, u64)>,
    stacks: HashMap<u32, Vec<FrameReport>>,
}

pub fn main(args: WatchArgs) -> ExitCode {
    let uid = nix::unistd::geteuid().as_raw();
    let dir = control::socket_dir(std::env::var("XDG_RUNTIME_DIR").ok().as_deref(), uid);
    let path = control::socket_path(&dir, args.pid);
    if let Some(secs) = args.wait {
        let deadline = Instant::now() + Duration::from_secs_f64(secs);
        while !Path::new(&path).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let stream = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            let why = match e.kind() {
                std::io::ErrorKind::NotFound => format!(
                    "no control socket at {path}: process {} was not started with `trapline run --control`, or has ended",
                    args.pid
                ),
                std::io::ErrorKind::ConnectionRefused => format!(
                    "{path} is left from a process that has ended (nothing answers there)"
                ),
                _ => format!("{path}: {e}"),
            };
            eprintln!("trapline watch: {why}");
            return ExitCode::from(crate::EXIT_ANALYSIS_ERROR);
        }
    };
    let mut w = Watcher {
        pid: args.pid,
        trace: None,
        times: Vec::new(),
        series: HashMap::new(),
        current: HashMap::new(),
        stacks: HashMap::new(),
    };
    let refresh = args.format == WatchFormat::Text && std::io::stdout().is_terminal();
    let mut reader = match stream.try_clone() {
        Ok(r) => BufReader::new(r),
        Err(e) => {
            eprintln!("trapline watch: {path}: {e}");
            return ExitCode::from(crate::EXIT_ANALYSIS_ERROR);
        }
    };
    let mut writer = stream;
    let start = Instant::now();
    let interval = Duration::from_secs_f64(args.interval);
    let mut looks = 0u32;
    loop {
        let answer = ask(&mut writer, &mut reader, control::SITES);
        let Some(answer) = answer else {
            // The process ended (or stopped serving): the last look stands.
            eprintln!("trapline watch: process {} is no longer served", args.pid);
            return ExitCode::SUCCESS;
        };
        if let Some(err) = answer.get("error").and_then(Value::as_str) {
            eprintln!("trapline watch: the agent answered: {err}");
            return ExitCode::from(crate::EXIT_ANALYSIS_ERROR);
        }
        w.observe(start.elapsed().as_secs_f64(), &answer);
        let growing = w.growing();
        w.name_stacks(growing.keys().map(|s| s.0).chain(w.largest(args.top)));
        let out = match args.format {
            WatchFormat::Jsonl => w.jsonl(&growing, args.top),
            WatchFormat::Text => w.text(&growing, args.top, refresh),
        };
        let mut stdout = std::io::stdout().lock();
        if stdout
            .write_all(out.as_bytes())
            .and_then(|_| stdout.flush())
            .is_err()
        {
            return ExitCode::SUCCESS;
        }
        looks += 1;
        if args.count.is_some_and(|n| looks >= n) {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(interval);
    }
}

/// A `trapline watch` that `trapline run --watch` started beside the
/// program, writing its looks to `TRACE.watch.jsonl`.
pub struct Beside {
    child: std::process::Child,
    looks: PathBuf,
}

/// Starts watching process `pid` every `secs` seconds, its looks next to
/// the trace `trace`; None (with a warning) if it cannot start.
pub fn start_beside(pid: u32, secs: f64, trace: &Path) -> Option<Beside> {
    let mut looks = trace.as_os_str().to_owned();
    looks.push(".watch.jsonl");
    let looks = PathBuf::from(looks);
    let started = std::fs::File::create(&looks).and_then(|out| {
        std::process::Command::new(std::env::current_exe()?)
            .args([
                "watch",
                &pid.to_string(),
                "--format",
                "jsonl",
                "--wait",
                "30",
            ])
            .arg("--interval")
            .arg(secs.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(std::process::Stdio::null())
            .spawn()
    });
    match started {
        Ok(child) => Some(Beside { child, looks }),
        Err(e) => {
            eprintln!(
                "==trapline== cannot watch the program ({}): {e}",
                looks.display()
            );
            None
        }
    }
}

impl Beside {
    /// The program has ended: waits for the watcher (which sees its socket
    /// go) and returns the summary lines, the sites still growing at its
    /// last look.
    pub fn finish(mut self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.looks).unwrap_or_default();
        let last: Option<Value> = text
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok());
        let Some(last) = last else {
            return vec![format!("watch: no look taken ({})", self.looks.display())];
        };
        let mut lines = vec![format!(
            "watch: {} looks in {}",
            last.get("looks").and_then(Value::as_u64).unwrap_or(0),
            self.looks.display()
        )];
        let sites = last.get("sites").and_then(Value::as_array);
        for s in sites.into_iter().flatten() {
            let Some(rate) = s
                .pointer("/growth/bytes_per_second")
                .and_then(Value::as_f64)
            else {
                continue;
            };
            let place = s
                .get("stack")
                .and_then(Value::as_array)
                .and_then(|frames| {
                    frames
                        .iter()
                        .find(|f| f.get("function").is_some_and(|v| !v.is_null()))
                })
                .map_or_else(
                    || format!("stack {}", s.get("stack_id").unwrap_or(&Value::Null)),
                    |f| {
                        let name = f.get("function").and_then(Value::as_str).unwrap_or("?");
                        match (
                            f.get("file").and_then(Value::as_str),
                            f.get("line").and_then(Value::as_u64),
                        ) {
                            (Some(file), Some(line)) => {
                                let file = Path::new(file)
                                    .file_name()
                                    .map_or(file.into(), |n| n.to_string_lossy());
                                format!("{name} ({file}:{line})")
                            }
                            _ => name.to_owned(),
                        }
                    },
                );
            lines.push(format!(
                "watch: still growing at the last look: {place}, +{} bytes/s",
                thousands(rate as u64)
            ));
        }
        lines
    }
}

/// Sends one request and reads its one-line answer (None: the agent is gone).
fn ask(
    writer: &mut UnixStream,
    reader: &mut BufReader<UnixStream>,
    request: &str,
) -> Option<Value> {
    writer.write_all(format!("{request}\n").as_bytes()).ok()?;
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => serde_json::from_str(&line).ok(),
    }
}

impl Watcher {
    /// Takes one answer to `sites` in, at `time` seconds.
    fn observe(&mut self, time: f64, answer: &Value) {
        if self.trace.is_none() {
            self.trace = answer
                .get("trace")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .map(PathBuf::from);
        }
        let n = self.times.len();
        self.times.push(time);
        self.current.clear();
        let sites = answer.get("sites").and_then(Value::as_array);
        for v in sites.into_iter().flatten().filter_map(Value::as_array) {
            let (Some(stack), Some(func), Some(bytes), Some(blocks)) = (
                v.first().and_then(Value::as_u64),
                v.get(1).and_then(Value::as_str),
                v.get(2).and_then(Value::as_u64),
                v.get(3).and_then(Value::as_u64),
            ) else {
                continue;
            };
            let site = (stack as u32, func.to_owned());
            let series = self.series.entry(site.clone()).or_default();
            series.resize(n, 0);
            series.push(bytes);
            self.current.insert(site, (bytes, blocks));
        }
        for series in self.series.values_mut() {
            series.resize(n + 1, 0);
        }
    }

    /// The sites judged growing over the looks so far.
    fn growing(&self) -> HashMap<Site, Growth> {
        self.series
            .iter()
            .filter_map(|(site, ys)| judge(&self.times, ys).map(|g| (site.clone(), g)))
            .collect()
    }

    /// The stack ids of the `n` largest sites now.
    fn largest(&self, n: usize) -> Vec<u32> {
        self.ranked(&HashMap::new(), n)
            .iter()
            .map(|s| s.0)
            .collect()
    }

    /// The sites to list: growing ones fastest first, then the largest.
    fn ranked(&self, growing: &HashMap<Site, Growth>, n: usize) -> Vec<Site> {
        let mut grow: Vec<&Site> = growing.keys().collect();
        grow.sort_by(|a, b| {
            growing[*b]
                .bytes_per_second
                .total_cmp(&growing[*a].bytes_per_second)
        });
        let mut big: Vec<(&Site, &(u64, u64))> = self.current.iter().collect();
        big.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(b.0)));
        let mut out: Vec<Site> = grow.into_iter().cloned().collect();
        for (site, _) in big.into_iter().take(n) {
            if !out.contains(site) {
                out.push(site.clone());
            }
        }
        out
    }

    /// Names the stacks not named yet from the trace as written so far (a
    /// stack the writer has not flushed yet is tried again at the next look).
    fn name_stacks(&mut self, ids: impl Iterator<Item = u32>) {
        let missing: Vec<u32> = ids.filter(|id| !self.stacks.contains_key(id)).collect();
        let Some(trace) = self.trace.as_deref().filter(|_| !missing.is_empty()) else {
            return;
        };
        let Ok(mut file) = std::fs::File::open(trace) else {
            return;
        };
        let Ok(named) = trapline_analysis::report::symbolized_stacks(&mut file, &missing) else {
            return;
        };
        self.stacks
            .extend(named.into_iter().filter(|(_, frames)| !frames.is_empty()));
    }

    fn jsonl(&self, growing: &HashMap<Site, Growth>, n: usize) -> String {
        let sites = self
            .ranked(growing, n)
            .into_iter()
            .map(|site| {
                let (bytes, blocks) = self.current.get(&site).copied().unwrap_or_default();
                (site, bytes, blocks)
            })
            .collect::<Vec<_>>();
        let look = Look {
            pid: self.pid,
            time_seconds: *self.times.last().unwrap_or(&0.0),
            looks: self.times.len(),
            live_bytes: self.current.values().map(|v| v.0).sum(),
            live_blocks: self.current.values().map(|v| v.1).sum(),
            sites: sites
                .iter()
                .map(|(site, bytes, blocks)| SiteLook {
                    stack_id: site.0,
                    allocated_by: &site.1,
                    bytes: *bytes,
                    blocks: *blocks,
                    growth: growing.get(site).cloned(),
                    stack: self.stacks.get(&site.0).map_or(&[], Vec::as_slice),
                })
                .collect(),
        };
        let mut line = serde_json::to_string(&look).unwrap_or_default();
        line.push('\n');
        line
    }

    fn text(&self, growing: &HashMap<Site, Growth>, n: usize, refresh: bool) -> String {
        let mut out = String::new();
        if refresh {
            // Home and clear: the table is redrawn in place.
            out.push_str("\x1b[H\x1b[2J");
        }
        let live: u64 = self.current.values().map(|v| v.0).sum();
        out.push_str(&format!(
            "trapline watch {}: {} bytes live in {} sites, look {} at {:.1} s{}\n",
            self.pid,
            thousands(live),
            thousands(self.current.len() as u64),
            self.times.len(),
            self.times.last().unwrap_or(&0.0),
            if self.times.len() < 8 {
                " (growth is judged from the 8th look)"
            } else {
                ""
            }
        ));
        out.push_str(&format!(
            "{:>14} {:>10} {:>14}  {}\n",
            "bytes", "blocks", "growth/s", "site"
        ));
        for site in self.ranked(growing, n) {
            let (bytes, blocks) = self.current.get(&site).copied().unwrap_or_default();
            let rate = growing.get(&site).map_or_else(String::new, |g| {
                format!("+{}", thousands(g.bytes_per_second as u64))
            });
            let frames = self.stacks.get(&site.0);
            let place = frames
                .and_then(|f| f.iter().find(|f| f.function.is_some()))
                .map_or_else(|| format!("stack {} ({})", site.0, site.1), frame_text);
            out.push_str(&format!(
                "{:>14} {:>10} {:>14}  {place}\n",
                thousands(bytes),
                thousands(blocks),
                rate
            ));
        }
        if !refresh {
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(sites: &[(u32, u64)]) -> Value {
        let sites: Vec<Value> = sites
            .iter()
            .map(|&(stack, bytes)| serde_json::json!([stack, "malloc", bytes, bytes / 100]))
            .collect();
        serde_json::json!({"pid": 7, "time_ns": 0, "trace": "", "sites": sites})
    }

    /// A site that climbs at every look is judged growing once there are
    /// enough looks; one that holds is not; a site missing from a look
    /// counts as 0 there.
    #[test]
    fn looks_build_each_sites_series() {
        let mut w = Watcher {
            pid: 7,
            trace: None,
            times: Vec::new(),
            series: HashMap::new(),
            stacks: HashMap::new(),
            current: HashMap::new(),
        };
        for i in 0..12u64 {
            let mut sites = vec![(1, 100_000 * (i + 1)), (2, 500_000)];
            if i != 5 {
                sites.push((3, 1_000));
            }
            w.observe(i as f64, &answer(&sites));
            let growing = w.growing();
            assert_eq!(
                growing.contains_key(&(1, "malloc".into())),
                i >= 7,
                "look {i}"
            );
            assert!(!growing.contains_key(&(2, "malloc".into())));
        }
        assert_eq!(w.series[&(3, "malloc".to_string())][5], 0);
        let line = w.jsonl(&w.growing(), 1);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["looks"], 12);
        assert_eq!(v["sites"][0]["stack_id"], 1);
        assert!(
            v["sites"][0]["growth"]["bytes_per_second"]
                .as_f64()
                .unwrap()
                > 90_000.0
        );
    }
}
