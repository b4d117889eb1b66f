//! What to watch in a running program and how to judge it: the policy
//! half of `trapline watch` (the mechanism is the agent's control socket,
//! crates/agent services/control.rs; the rendering is the CLI's).
//!
//! Every look, the policy takes the agent's live bytes per allocation
//! site, keeps each site's series and judges which sites keep growing
//! with the estimator `trapline leaks` uses (trapline-analysis's
//! `growth`). It has the agent watch old blocks of the suspect sites
//! (growing, or with unreachable blocks) for accesses, within a budget of
//! the program's time spent in faults, and judges a suspect site stale
//! when its watched blocks stay untouched. It ranks the sites, writes
//! changed verdicts into the trace through the agent, and names the
//! sites from the trace the agent is writing. The agent is reached only
//! through a function that sends one request and returns its answer, so
//! the policy runs as well on a recorded series as on a live process
//! (docs/watching.md).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;
use trapline_analysis::growth::{judge, judge_estimated, Growth};
use trapline_analysis::report::FrameReport;
use trapline_analysis::staleness::Staleness;
use trapline_contract::control;

/// The access monitoring of suspect sites' old blocks.
#[derive(Clone, Copy, Debug)]
pub struct StalenessOptions {
    /// Seconds a watched block must stay untouched to count as stale.
    pub stale_after: f64,
    /// The share of the program's time its faults may take (0.01: 1%).
    pub fault_budget: f64,
}

/// One look's line of `--format jsonl`.
#[derive(Serialize)]
pub struct Look<'a> {
    pub pid: u32,
    /// Seconds since the first look.
    pub time_seconds: f64,
    /// Looks so far.
    pub looks: usize,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub monitor: Option<Monitor>,
    pub sites: Vec<SiteLook<'a>>,
}

#[derive(Serialize)]
pub struct SiteLook<'a> {
    pub stack_id: u32,
    pub allocated_by: String,
    pub bytes: u64,
    pub blocks: u64,
    /// Sampled recording, a full stack: the bytes of all its blocks,
    /// estimated from the sampled ones `bytes` counts (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_bytes: Option<u64>,
    /// Sampled recording: the stack is the caller of blocks that took no
    /// full stack (absent when false).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub caller_only: bool,
    /// What is wrong with the site, strongest first: `unreachable`,
    /// `growing`, `stale`.
    pub verdicts: Vec<&'static str>,
    /// Why the site is judged growing, or null.
    pub growth: Option<Growth>,
    /// What watching its blocks for accesses found, or null (not watched).
    pub staleness: Option<Staleness>,
    /// Unreachable bytes and blocks at the last scan, or null (none).
    pub unreachable: Option<[u64; 2]>,
    /// Blocks by age (`control::AGE_BUCKETS_S`).
    pub ages: Vec<u64>,
    /// Blocks born and released since the previous look.
    pub new_blocks: u64,
    pub gone_blocks: u64,
    /// The allocation stack (empty until the agent has written it).
    pub stack: &'a [FrameReport],
}

/// The access monitor's state and cost, in each look.
#[derive(Serialize, Clone, Default)]
pub struct Monitor {
    /// `userfaultfd`, `off`, or why none can be used.
    pub mechanism: String,
    pub faults: u64,
    /// Time the faults and the arming cost, the agent's handling plus
    /// `TRAP_NS` per fault for the kernel's part.
    pub fault_seconds: f64,
    /// That time's share of the last interval.
    pub fault_fraction: f64,
    pub armed_pages: u64,
    /// Blocks watched per suspect site at once (adapts to the budget).
    pub blocks_per_site: usize,
}

/// A site: its allocation stack id and the allocation function.
pub type Site = (u32, String);

/// What a site's live blocks were at the last look.
#[derive(Clone, Default)]
struct SiteNow {
    bytes: u64,
    blocks: u64,
    estimated_bytes: Option<u64>,
    caller_only: bool,
    ages: Vec<u64>,
    new_blocks: u64,
    gone_blocks: u64,
}

/// A block whose pages the agent watches.
struct BlockWatch {
    site: Site,
    /// Its bytes: a touch elsewhere on its page is not its own.
    size: u64,
    pages: Vec<u64>,
    /// Seconds since the first look, when armed.
    armed_at: f64,
}

/// What watching a site's blocks has found so far.
#[derive(Default)]
struct SiteAccess {
    touched: u64,
    last_access: Option<f64>,
}

/// The staleness policy's state.
struct Access {
    stale_after: f64,
    budget: f64,
    blocks_per_site: usize,
    watched: HashMap<u64, BlockWatch>,
    /// The watched blocks on each watched page.
    on_page: HashMap<u64, Vec<u64>>,
    /// Blocks seen accessed, refused, or on a page busy with another
    /// block: not watched again.
    done: std::collections::HashSet<u64>,
    sites: HashMap<Site, SiteAccess>,
    monitor: Monitor,
    /// The cost counters at the previous look, and when.
    previous: Option<(f64, f64)>,
}

/// Looks whose series a watcher judges, at most (`Watcher::thin_looks`).
const MAX_LOOKS_KEPT: usize = 256;

/// The policy's state over the looks at one process.
pub struct Watcher {
    pid: u32,
    trace: Option<PathBuf>,
    /// Looks taken in all, and the times of those kept.
    looks: usize,
    times: Vec<f64>,
    series: HashMap<Site, Vec<u64>>,
    /// The sampling variance of each estimated series' looks (a site whose
    /// looks gave estimates).
    variances: HashMap<Site, Vec<f64>>,
    /// Each site's live blocks at the last look.
    current: HashMap<Site, SiteNow>,
    stacks: HashMap<u32, Vec<FrameReport>>,
    access: Option<Access>,
    /// Unreachable bytes and blocks per site at the last scan.
    lost: HashMap<Site, (u64, u64)>,
    /// The verdicts last written into the trace per site.
    written: HashMap<Site, u64>,
}

impl Access {
    fn new(options: StalenessOptions) -> Access {
        Access {
            stale_after: options.stale_after,
            budget: options.fault_budget,
            blocks_per_site: BLOCKS_PER_SITE,
            watched: HashMap::new(),
            on_page: HashMap::new(),
            done: Default::default(),
            sites: HashMap::new(),
            monitor: Monitor::default(),
            previous: None,
        }
    }

    /// Takes an answer to `watches` in: a watched page touched at a byte
    /// of a watched block means that block was accessed; a touch elsewhere
    /// on the page (another block, or allocator memory: in production mode
    /// most of a page is blocks nobody sampled) ends the page's other
    /// watches with nothing learned, and they are not watched again (their
    /// page is busy). An agent that cannot say which byte was touched (0)
    /// counts every watched block on the page accessed. A page given back
    /// unaccessed ends its blocks' watches with nothing learned. An ended
    /// block's other pages are given back too.
    fn learn(&mut self, now: f64, answer: &Value, agent: &mut impl FnMut(&str) -> Option<Value>) {
        let mut ended: Vec<u64> = Vec::new();
        let watches = answer.get("watches").and_then(Value::as_array);
        for v in watches.into_iter().flatten().filter_map(Value::as_array) {
            let (Some(page), Some(outcome)) = (
                v.first().and_then(Value::as_u64),
                v.get(1).and_then(Value::as_str),
            ) else {
                continue;
            };
            if outcome == "armed" {
                continue;
            }
            let touched_at = v.get(5).and_then(Value::as_u64).unwrap_or(0);
            for addr in self.on_page.remove(&page).unwrap_or_default() {
                let Some(b) = self.watched.remove(&addr) else {
                    continue;
                };
                if outcome == "touched" {
                    let own = touched_at == 0 || (addr..addr + b.size.max(1)).contains(&touched_at);
                    if own {
                        let seen = self.sites.entry(b.site.clone()).or_default();
                        seen.touched += 1;
                        seen.last_access = Some(now);
                    }
                    self.done.insert(addr);
                }
                for p in &b.pages {
                    if let Some(blocks) = self.on_page.get_mut(p) {
                        blocks.retain(|&x| x != addr);
                        if blocks.is_empty() {
                            self.on_page.remove(p);
                        }
                    }
                }
                ended.push(addr);
            }
        }
        // Their pages that no other watched block shares: given back.
        if !ended.is_empty() {
            let mut request = control::DISARM.to_owned();
            for addr in &ended {
                request.push_str(&format!(" {addr}"));
            }
            agent(&request);
        }
    }

    /// Reads the agent's counters and keeps the time in faults within the
    /// budget: fewer blocks per site when over it (and none at all when
    /// far over), more when well under.
    fn budget_round(
        &mut self,
        now: f64,
        counters: &Value,
        agent: &mut impl FnMut(&str) -> Option<Value>,
    ) {
        let n = |k: &str| counters.get(k).and_then(Value::as_u64).unwrap_or(0);
        let faults = n("faults");
        let cost = (n("fault_ns") + n("arm_ns")) as f64 + faults as f64 * TRAP_NS;
        self.monitor.mechanism = counters
            .get("access_monitor")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        self.monitor.faults = faults;
        self.monitor.fault_seconds = cost / 1e9;
        self.monitor.armed_pages = n("armed_pages");
        if let Some((then, cost_then)) = self.previous {
            let span = (now - then) * 1e9;
            if span > 0.0 {
                let share = (cost - cost_then).max(0.0) / span;
                self.monitor.fault_fraction = share;
                if share > 2.0 * self.budget {
                    agent(&format!("{} all", control::DISARM));
                    self.watched.clear();
                    self.on_page.clear();
                }
                if share > self.budget {
                    self.blocks_per_site = (self.blocks_per_site / 2).max(MIN_BLOCKS_PER_SITE);
                } else if share < self.budget / 4.0 {
                    self.blocks_per_site = (self.blocks_per_site * 2).min(MAX_BLOCKS_PER_SITE);
                }
            }
        }
        self.previous = Some((now, cost));
        self.monitor.blocks_per_site = self.blocks_per_site;
    }
}

/// The kernel's part of a fault's cost, which the agent cannot time:
/// 4.5 to 5.2 us measured per userfaultfd fault on these machines.
const TRAP_NS: f64 = 5_000.0;
/// Blocks per suspect site watched at once: the first, least and most.
const BLOCKS_PER_SITE: usize = 32;
const MIN_BLOCKS_PER_SITE: usize = 2;
const MAX_BLOCKS_PER_SITE: usize = 512;
/// Blocks remembered as accessed or refused, at most.
const MAX_REMEMBERED: usize = 100_000;

impl Watcher {
    /// A watcher of process `pid`; `staleness` turns on the access
    /// monitoring of suspect sites' old blocks.
    pub fn new(pid: u32, staleness: Option<StalenessOptions>) -> Watcher {
        Watcher {
            pid,
            trace: None,
            times: Vec::new(),
            looks: 0,
            series: HashMap::new(),
            variances: HashMap::new(),
            current: HashMap::new(),
            stacks: HashMap::new(),
            access: staleness.map(Access::new),
            lost: HashMap::new(),
            written: HashMap::new(),
        }
    }

    /// Takes an answer to `scan` in: the unreachable blocks per site.
    pub fn observe_scan(&mut self, answer: &Value) {
        let Some(lost) = answer.get("lost").and_then(Value::as_array) else {
            return;
        };
        self.lost.clear();
        for v in lost.iter().filter_map(Value::as_array) {
            if let (Some(stack), Some(func), Some(bytes), Some(blocks)) = (
                v.first().and_then(Value::as_u64),
                v.get(1).and_then(Value::as_str),
                v.get(2).and_then(Value::as_u64),
                v.get(3).and_then(Value::as_u64),
            ) {
                self.lost
                    .insert((stack as u32, func.to_owned()), (bytes, blocks));
            }
        }
    }

    /// Sites suspected of leaking: growing, or with unreachable blocks.
    fn suspects(&self, growing: &HashMap<Site, Growth>) -> Vec<Site> {
        let mut out: Vec<Site> = growing.keys().cloned().collect();
        for site in self.lost.keys() {
            if !out.contains(site) {
                out.push(site.clone());
            }
        }
        out.sort();
        out
    }

    /// One round of the staleness policy: learns what became of the
    /// watched pages, keeps the fault cost within the budget, and has the
    /// agent watch old blocks of the suspect sites.
    pub fn watch_for_access(
        &mut self,
        now: f64,
        growing: &HashMap<Site, Growth>,
        agent: &mut impl FnMut(&str) -> Option<Value>,
    ) {
        let suspects = self.suspects(growing);
        let Some(a) = self.access.as_mut() else {
            return;
        };
        if let Some(answer) = agent(control::WATCHES) {
            a.learn(now, &answer, agent);
        }
        if let Some(c) = agent(control::COUNTERS) {
            a.budget_round(now, &c, agent);
        }
        if a.monitor.mechanism.starts_with("unavailable") {
            return;
        }
        // Old enough: a block younger than this is still in use, and a
        // page holding one is hot.
        let min_age_ms = (a.stale_after * 250.0).clamp(1_000.0, 60_000.0) as u64;
        let mut wanted: HashMap<u64, (Site, u64)> = HashMap::new();
        for site in &suspects {
            let have = a.watched.values().filter(|b| &b.site == site).count();
            if have >= a.blocks_per_site {
                continue;
            }
            let ask_for = (a.blocks_per_site - have) * 2 + 8;
            let request = format!(
                "{} {} {} {ask_for} {min_age_ms}",
                control::BLOCKS,
                site.0,
                site.1
            );
            let Some(answer) = agent(&request) else {
                return;
            };
            let blocks = answer.get("blocks").and_then(Value::as_array);
            let fresh = blocks
                .into_iter()
                .flatten()
                .filter_map(|b| Some((b.get(0)?.as_u64()?, b.get(1)?.as_u64()?)))
                .filter(|(addr, _)| !a.watched.contains_key(addr) && !a.done.contains(addr))
                .take(a.blocks_per_site - have);
            wanted.extend(fresh.map(|(addr, size)| (addr, (site.clone(), size))));
        }
        if wanted.is_empty() {
            return;
        }
        let mut request = format!("{} {min_age_ms}", control::ARM);
        for addr in wanted.keys() {
            request.push_str(&format!(" {addr}"));
        }
        let Some(answer) = agent(&request) else {
            return;
        };
        if let Some(err) = answer.get("error").and_then(Value::as_str) {
            a.monitor.mechanism = err.to_owned();
            return;
        }
        // Addresses come back as new blocks: a long run forgets them now
        // and then rather than skip new blocks for ever.
        if a.done.len() > MAX_REMEMBERED {
            a.done.clear();
        }
        // A block refused is not asked for again (its pages are shared).
        let refused = answer.get("refused").and_then(Value::as_array);
        for v in refused.into_iter().flatten().filter_map(Value::as_array) {
            if let Some(addr) = v.first().and_then(Value::as_u64) {
                a.done.insert(addr);
            }
        }
        let armed = answer.get("armed").and_then(Value::as_array);
        for v in armed.into_iter().flatten().filter_map(Value::as_array) {
            let (Some(addr), Some(pages)) = (
                v.first().and_then(Value::as_u64),
                v.get(1).and_then(Value::as_array),
            ) else {
                continue;
            };
            let pages: Vec<u64> = pages.iter().filter_map(Value::as_u64).collect();
            let Some((site, size)) = wanted.get(&addr).cloned() else {
                continue;
            };
            for p in &pages {
                a.on_page.entry(*p).or_default().push(addr);
            }
            a.watched.insert(
                addr,
                BlockWatch {
                    site,
                    size,
                    pages,
                    armed_at: now,
                },
            );
        }
    }

    /// The verdicts of every site now, strongest first.
    pub fn verdicts(
        &self,
        now: f64,
        site: &Site,
        growing: &HashMap<Site, Growth>,
    ) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.lost.contains_key(site) {
            v.push("unreachable");
        }
        if growing.contains_key(site) {
            v.push("growing");
        }
        // Data that is rarely read but still reachable and not growing is
        // no leak suspect (an idle keyspace): stale counts only beside
        // another verdict, although the site's blocks stay watched.
        if !v.is_empty() && self.staleness(now, site).is_some_and(|s| s.is_stale()) {
            v.push("stale");
        }
        v
    }

    /// What watching `site`'s blocks found (None: none watched).
    pub fn staleness(&self, now: f64, site: &Site) -> Option<Staleness> {
        let a = self.access.as_ref()?;
        let seen = a.sites.get(site);
        let mut watched = 0u64;
        let mut untouched = 0u64;
        let mut shortest: Option<f64> = None;
        for b in a.watched.values().filter(|b| &b.site == site) {
            watched += 1;
            let quiet = now - b.armed_at;
            if quiet >= a.stale_after {
                untouched += 1;
                shortest = Some(shortest.map_or(quiet, |s: f64| s.min(quiet)));
            }
        }
        let touched = seen.map_or(0, |s| s.touched);
        if watched + touched == 0 {
            return None;
        }
        Some(Staleness {
            watched_blocks: watched + touched,
            untouched_blocks: untouched,
            touched_blocks: touched,
            untouched_seconds: shortest.unwrap_or(0.0),
            last_access_seconds_ago: seen.and_then(|s| s.last_access).map(|t| now - t),
        })
    }

    /// Writes into the trace, through the agent, the verdict of each site
    /// whose verdicts changed since the last look.
    pub fn write_verdicts(
        &mut self,
        now: f64,
        growing: &HashMap<Site, Growth>,
        agent: &mut impl FnMut(&str) -> Option<Value>,
    ) {
        let mut sites: Vec<Site> = self.suspects(growing);
        sites.extend(self.written.keys().cloned());
        sites.sort();
        sites.dedup();
        for site in sites {
            let verdicts = self.verdicts(now, &site, growing);
            let mut kinds = 0u64;
            if verdicts.contains(&"growing") {
                kinds |= trapline_trace::event::site_verdict::GROWING;
            }
            if verdicts.contains(&"stale") {
                kinds |= trapline_trace::event::site_verdict::STALE;
            }
            if self.written.get(&site).copied().unwrap_or(0) == kinds {
                continue;
            }
            let rate = growing
                .get(&site)
                .map_or(0, |g| g.bytes_per_second.max(0.0) as u64);
            let s = self.staleness(now, &site);
            let (watched, untouched, quiet_ms) = s.as_ref().map_or((0, 0, 0), |s| {
                (
                    s.watched_blocks,
                    s.untouched_blocks,
                    (s.untouched_seconds * 1000.0) as u64,
                )
            });
            let request = format!(
                "{} {} {} {kinds} {rate} {watched} {untouched} {quiet_ms} 0",
                control::VERDICT,
                site.0,
                site.1
            );
            if agent(&request).is_some_and(|a| a.get("written").is_some()) {
                self.written.insert(site, kinds);
            }
        }
    }

    /// Takes one answer to `sites` in, at `time` seconds.
    pub fn observe(&mut self, time: f64, answer: &Value) {
        if self.trace.is_none() {
            self.trace = answer
                .get("trace")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .map(PathBuf::from);
        }
        let n = self.times.len();
        self.looks += 1;
        self.times.push(time);
        self.current.clear();
        let sites = answer.get("sites").and_then(Value::as_array);
        for v in sites.into_iter().flatten() {
            let (Some(stack), Some(func), Some(bytes), Some(blocks)) = (
                v.get("stack").and_then(Value::as_u64),
                v.get("fn").and_then(Value::as_str),
                v.get("bytes").and_then(Value::as_u64),
                v.get("blocks").and_then(Value::as_u64),
            ) else {
                continue;
            };
            let count = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
            let site = (stack as u32, func.to_owned());
            let series = self.series.entry(site.clone()).or_default();
            series.resize(n, 0);
            // Under sampled recording, a full stack's sampled blocks stand
            // for all of its blocks: its growth is judged on the estimate.
            let estimated_bytes = v.get("estimated_bytes").and_then(Value::as_u64);
            series.push(estimated_bytes.unwrap_or(bytes));
            if let Some(variance) = v.get("estimate_variance").and_then(Value::as_f64) {
                let variances = self.variances.entry(site.clone()).or_default();
                variances.resize(n, 0.0);
                variances.push(variance);
            }
            let ages = v.get("ages").and_then(Value::as_array);
            self.current.insert(
                site,
                SiteNow {
                    bytes,
                    blocks,
                    estimated_bytes,
                    caller_only: v.get("caller_only") == Some(&Value::Bool(true)),
                    ages: ages
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_u64)
                        .collect(),
                    new_blocks: count("new_blocks"),
                    gone_blocks: count("gone_blocks"),
                },
            );
        }
        for series in self.series.values_mut() {
            series.resize(n + 1, 0);
        }
        for variances in self.variances.values_mut() {
            variances.resize(n + 1, 0.0);
        }
        if self.times.len() > MAX_LOOKS_KEPT {
            self.thin_looks();
        }
    }

    /// Keeps every other look, back from the latest: judging costs the
    /// square of the looks kept, so a watcher left on for days keeps at most
    /// `MAX_LOOKS_KEPT`, evenly thinned over the run, the recent ones densest.
    fn thin_looks(&mut self) {
        fn keep<T: Copy>(v: &mut Vec<T>) {
            let n = v.len();
            let kept: Vec<T> = (0..n)
                .filter(|i| (n - 1 - i).is_multiple_of(2))
                .map(|i| v[i])
                .collect();
            *v = kept;
        }
        keep(&mut self.times);
        self.series.values_mut().for_each(keep);
        self.variances.values_mut().for_each(keep);
    }

    /// The sites judged growing over the looks so far: an estimated
    /// series (production mode, `--sample`) only when it rose by more than
    /// its sampling noise (`trapline_analysis::growth::judge_estimated`).
    pub fn growing(&self) -> HashMap<Site, Growth> {
        self.series
            .iter()
            .filter_map(|(site, ys)| {
                let judged = match self.variances.get(site) {
                    Some(v) => judge_estimated(&self.times, ys, v),
                    None => judge(&self.times, ys),
                };
                judged.map(|g| (site.clone(), g))
            })
            .collect()
    }

    /// The stack ids of the `n` largest sites now.
    pub fn largest(&self, n: usize) -> Vec<u32> {
        self.ranked(0.0, &HashMap::new(), n)
            .iter()
            .map(|s| s.0)
            .collect()
    }

    /// The sites to list: those with verdicts first (more verdicts first,
    /// then faster growth, then more bytes), then the largest.
    pub fn ranked(&self, now: f64, growing: &HashMap<Site, Growth>, n: usize) -> Vec<Site> {
        let mut judged: Vec<(Site, usize)> = self
            .suspects(growing)
            .into_iter()
            .map(|s| {
                let k = self.verdicts(now, &s, growing).len();
                (s, k)
            })
            .filter(|(_, k)| *k > 0)
            .collect();
        let rate = |s: &Site| growing.get(s).map_or(0.0, |g| g.bytes_per_second);
        let bytes = |s: &Site| self.current.get(s).map_or(0, |c| c.bytes);
        judged.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then(rate(&b.0).total_cmp(&rate(&a.0)))
                .then(bytes(&b.0).cmp(&bytes(&a.0)))
                .then(a.0.cmp(&b.0))
        });
        let mut big: Vec<(&Site, &SiteNow)> = self.current.iter().collect();
        big.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
        let mut out: Vec<Site> = judged.into_iter().map(|(s, _)| s).collect();
        for (site, _) in big.into_iter().take(n) {
            if !out.contains(site) {
                out.push(site.clone());
            }
        }
        out
    }

    /// Names the stacks not named yet from the trace as written so far (a
    /// stack the writer has not flushed yet is tried again at the next look).
    pub fn name_stacks(&mut self, ids: impl Iterator<Item = u32>) {
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

    /// How many sites have live blocks now.
    pub fn site_count(&self) -> usize {
        self.current.len()
    }

    /// The look at `now`: the process's live heap, the access monitor, and
    /// the ranked sites (`ranked`) with their verdicts and evidence.
    pub fn look(&self, now: f64, growing: &HashMap<Site, Growth>, n: usize) -> Look<'_> {
        let none = SiteNow::default();
        let sites = self.ranked(now, growing, n);
        Look {
            pid: self.pid,
            time_seconds: *self.times.last().unwrap_or(&0.0),
            looks: self.looks,
            live_bytes: self.current.values().map(|v| v.bytes).sum(),
            live_blocks: self.current.values().map(|v| v.blocks).sum(),
            monitor: self.access.as_ref().map(|a| a.monitor.clone()),
            sites: sites
                .iter()
                .map(|site| {
                    let c = self.current.get(site).unwrap_or(&none);
                    SiteLook {
                        stack_id: site.0,
                        allocated_by: site.1.clone(),
                        bytes: c.bytes,
                        blocks: c.blocks,
                        estimated_bytes: c.estimated_bytes,
                        caller_only: c.caller_only,
                        verdicts: self.verdicts(now, site, growing),
                        growth: growing.get(site).cloned(),
                        staleness: self.staleness(now, site),
                        unreachable: self.lost.get(site).map(|&(b, n)| [b, n]),
                        ages: c.ages.clone(),
                        new_blocks: c.new_blocks,
                        gone_blocks: c.gone_blocks,
                        stack: self.stacks.get(&site.0).map_or(&[], Vec::as_slice),
                    }
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(sites: &[(u32, u64)]) -> Value {
        let sites: Vec<Value> = sites
            .iter()
            .map(|&(stack, bytes)| {
                serde_json::json!({"stack": stack, "fn": "malloc", "bytes": bytes, "blocks": bytes / 100})
            })
            .collect();
        serde_json::json!({"pid": 7, "time_ns": 0, "trace": "", "sites": sites})
    }

    /// A site that climbs at every look is judged growing once there are
    /// enough looks; one that holds is not; a site missing from a look
    /// counts as 0 there.
    #[test]
    fn looks_build_each_sites_series() {
        let mut w = Watcher::new(7, None);
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
        let v = serde_json::to_value(w.look(12.0, &w.growing(), 1)).unwrap();
        assert_eq!(v["looks"], 12);
        assert_eq!(v["sites"][0]["stack_id"], 1);
        assert!(
            v["sites"][0]["growth"]["bytes_per_second"]
                .as_f64()
                .unwrap()
                > 90_000.0
        );
    }

    /// A recorded series, replayed against a scripted agent: two sites
    /// grow; the blocks watched of site 1 stay untouched, those of site 2
    /// are read. Site 1 is judged growing and stale, site 2 growing only,
    /// and the verdicts written into the trace say so; a fault cost over
    /// twice the budget gives every page back and halves the blocks per
    /// site.
    #[test]
    fn a_series_replayed_against_a_scripted_agent_gives_stale_and_growing() {
        let options = StalenessOptions {
            stale_after: 5.0,
            fault_budget: 0.01,
        };
        let mut w = Watcher::new(7, Some(options));
        // Site s's blocks: s * 0x100000 + k * 0x1000, one per page.
        let block = |s: u64, k: u64| s * 0x10_0000 + k * 0x1000;
        let mut armed: Vec<u64> = Vec::new();
        let mut written: Vec<String> = Vec::new();
        let mut disarmed_all = false;
        let mut fault_ns = 0u64;
        for i in 0..20u64 {
            let now = i as f64;
            w.observe(
                now,
                &answer(&[(1, 100_000 * (i + 1)), (2, 50_000 * (i + 1))]),
            );
            let growing = w.growing();
            if i == 19 {
                // Faults that took 5% of the last second: over twice the 1%.
                fault_ns = 1_000_000_000 / 20;
            }
            let mut agent = |request: &str| -> Option<Value> {
                let words: Vec<&str> = request.split(' ').collect();
                Some(match words[0] {
                    control::BLOCKS => {
                        let s: u64 = words[1].parse().unwrap();
                        let blocks: Vec<Value> = (0..6)
                            .map(|k| serde_json::json!([block(s, k), 64, 9_000]))
                            .collect();
                        serde_json::json!({ "blocks": blocks })
                    }
                    control::ARM => {
                        let list: Vec<Value> = words[2..]
                            .iter()
                            .map(|a| {
                                let a: u64 = a.parse().unwrap();
                                armed.push(a);
                                serde_json::json!([a, [a]])
                            })
                            .collect();
                        serde_json::json!({ "armed": list, "refused": [] })
                    }
                    control::WATCHES if i == 12 => {
                        // Every watched page of site 2 was read.
                        let touched: Vec<Value> = armed
                            .iter()
                            .filter(|&&a| a >> 20 == 2)
                            .map(|&a| serde_json::json!([a, "touched", 0, 0, 1]))
                            .collect();
                        serde_json::json!({ "watches": touched })
                    }
                    control::WATCHES => serde_json::json!({ "watches": [] }),
                    control::COUNTERS => serde_json::json!({
                        "access_monitor": "userfaultfd",
                        "faults": 0,
                        "fault_ns": fault_ns,
                        "arm_ns": 0,
                        "armed_pages": armed.len(),
                    }),
                    control::DISARM => {
                        disarmed_all |= words.get(1) == Some(&"all");
                        serde_json::json!({ "disarmed": 0 })
                    }
                    control::VERDICT => {
                        written.push(words[1..4].join(" "));
                        serde_json::json!({ "written": true })
                    }
                    other => panic!("unexpected request {other}"),
                })
            };
            w.watch_for_access(now, &growing, &mut agent);
            w.write_verdicts(now, &growing, &mut agent);
            if i == 18 {
                let growing = w.growing();
                let site = |s: u32| (s, "malloc".to_owned());
                assert_eq!(w.verdicts(now, &site(1), &growing), ["growing", "stale"]);
                assert_eq!(w.verdicts(now, &site(2), &growing), ["growing"]);
                let touched = w.staleness(now, &site(2)).unwrap();
                assert_eq!((touched.touched_blocks, touched.untouched_blocks), (6, 0));
                let look = serde_json::to_value(w.look(now, &growing, 2)).unwrap();
                assert_eq!(look["monitor"]["blocks_per_site"], 512);
            }
        }
        let (growing, stale) = (
            trapline_trace::event::site_verdict::GROWING,
            trapline_trace::event::site_verdict::STALE,
        );
        // Growth shows from the 8th look; site 1 turns stale 5 s after its
        // blocks were armed, and growing only again once the budget gave
        // its watched pages back (the evidence went with them).
        assert_eq!(
            written,
            [
                format!("1 malloc {growing}"),
                format!("2 malloc {growing}"),
                format!("1 malloc {}", growing | stale),
                format!("1 malloc {growing}"),
            ]
        );
        assert!(disarmed_all);
        let look = serde_json::to_value(w.look(19.0, &w.growing(), 2)).unwrap();
        assert_eq!(look["monitor"]["blocks_per_site"], 256);
        assert_eq!(look["sites"][0]["verdicts"], serde_json::json!(["growing"]));
    }

    /// Three watched blocks of one site share a page. A touch at a byte of
    /// the second counts it accessed and ends the others' watches with
    /// nothing learned; a touch between blocks (allocator memory, or a
    /// block nobody sampled) counts none; an agent that cannot say which
    /// byte (0) counts every block on the page. None is watched again.
    #[test]
    fn a_touch_counts_only_for_the_block_it_reached() {
        let site: Site = (1, "malloc".into());
        let touched_after = |at: u64| {
            let mut a = Access::new(StalenessOptions {
                stale_after: 5.0,
                fault_budget: 0.01,
            });
            for (k, addr) in [0x1010u64, 0x1410, 0x1810].into_iter().enumerate() {
                a.on_page.entry(0x1000).or_default().push(addr);
                a.watched.insert(
                    addr,
                    BlockWatch {
                        site: site.clone(),
                        size: 0x300 + k as u64,
                        pages: vec![0x1000],
                        armed_at: 0.0,
                    },
                );
            }
            let answer = serde_json::json!({ "watches": [[0x1000, "touched", 0, 0, 9, at]] });
            let mut disarmed = Vec::new();
            a.learn(3.0, &answer, &mut |r: &str| {
                disarmed.push(r.to_owned());
                Some(serde_json::json!({ "disarmed": 1 }))
            });
            assert!(a.watched.is_empty() && a.on_page.is_empty());
            assert_eq!(a.done.len(), 3);
            assert_eq!(disarmed.len(), 1);
            a.sites.get(&site).map_or(0, |s| s.touched)
        };
        assert_eq!(touched_after(0x1420), 1);
        assert_eq!(touched_after(0x1410 + 0x301 - 1), 1);
        assert_eq!(touched_after(0x1410 + 0x301), 0);
        assert_eq!(touched_after(0x1008), 0);
        assert_eq!(touched_after(0), 3);
    }

    /// A watcher left on keeps at most `MAX_LOOKS_KEPT` looks, the latest
    /// always, and still judges a leak growing and a steady site not.
    #[test]
    fn a_long_watch_keeps_a_bounded_thinned_series() {
        let mut w = Watcher::new(7, None);
        for i in 0..1000u64 {
            w.observe(i as f64, &answer(&[(1, 1000 * (i + 1)), (2, 500_000)]));
            assert!(w.times.len() <= MAX_LOOKS_KEPT);
            assert_eq!(w.times.last(), Some(&(i as f64)));
            assert_eq!(w.series[&(1, "malloc".to_string())].len(), w.times.len());
        }
        let growing = w.growing();
        assert!(growing.contains_key(&(1, "malloc".into())));
        assert!(!growing.contains_key(&(2, "malloc".into())));
        let v = serde_json::to_value(w.look(999.0, &growing, 2)).unwrap();
        assert_eq!(v["looks"], 1000);
        let slope = v["sites"][0]["growth"]["bytes_per_second"]
            .as_f64()
            .unwrap();
        assert_eq!(slope, 1000.0);
    }
}
