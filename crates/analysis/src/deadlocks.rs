//! Deadlocks: potential deadlocks by the generalized Goodlock algorithm, and
//! the actual deadlock of a program that hung while recorded.
//!
//! One streaming pass builds the lock graph: whenever a thread acquires a
//! lock by a blocking call while holding others, an edge from every held
//! lock to the new one, labelled with the thread, its guard set (every lock
//! it held then) and its thread segment. A successful trylock (or timed
//! lock) makes its lock held but adds no edge into it: it cannot wait.
//! Segments split at pthread_create (creator) and pthread_join (joiner), and
//! a child's first segment follows its creator's segment before the create,
//! a joiner's segment after the join follows the joined thread's last one:
//! a happens-before order between segments.
//!
//! After the pass, every simple cycle of the graph, of any length (a search
//! bounded by [`MAX_CYCLES`] cycles, [`MAX_SEARCH_STEPS`] steps and
//! [`MAX_CYCLE`] locks, whichever it meets first, and the report says which)
//! is checked with the labels: it is a potential deadlock only if one edge
//! per step can be chosen such that all come from different threads, their
//! guard sets are pairwise disjoint (a common "gate" lock serializes them;
//! a thread also holds what its creator held from before the create until
//! it joined the thread, `InheritedGuards`, unless the other edge is that
//! very hold: the creator's own, or a sibling's under the same hold),
//! no edge's segment happens before another's, and no step is a read hold
//! meeting a read request on an rwlock (glibc's rwlocks prefer readers, so
//! read-read does not block). A cycle whose edges all come from one thread
//! is a lock-order inversion instead (reported apart, lower severity).
//!
//! A thread made by pthread_create is a node of the graph too: it holds
//! its own run from its start to its end, and a pthread_join waits for it.
//! Each blocking request of the thread is also an edge from its node, and a
//! join an edge from every lock the joiner holds (and from the joiner's own
//! node) into the joined thread's. Holding L while joining a thread that
//! took L is thus the cycle L -> thread -> L: whichever came first in this
//! run, the other order hangs.
//!
//! At the end of the trace, threads still waiting in a lock request (a
//! `Request` without its acquisition: the program hung and was stopped) form
//! a wait-for graph with the holders of those locks; its cycles are actual
//! deadlocks.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write as _;

use serde::Serialize;
use trapline_trace::{Event, LockEvent, LockKind, LockMode, LockOp, TraceError};

use crate::index::{ChunkEntry, MergedEvent, ReadStatus, TraceIndex};
use crate::index_file::{ChunkSummary, IndexFile, Learned, TraceInput};
use crate::lockstate::{
    errors_text, mode_name, stack_text, Applied, Held, LockError, LockId, LockState,
};
use crate::pass::Pass;
use crate::report::{
    command_text, footer_text, prefix, serialize_hex, warnings_text, Facts, FrameReport,
    ProcessReport, StackSymbolizer, TraceStatus,
};

/// Longest cycle searched for, in locks: far beyond any real lock order
/// (the search recurses once per lock of the path).
pub const MAX_CYCLE: usize = 10_000;
/// Most cycles reported (the search stops there and says so).
pub const MAX_CYCLES: usize = 1000;

/// The `trapline deadlocks` report (its JSON form is the stable schema).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeadlocksReport {
    /// The traced process.
    pub process: ProcessReport,
    /// Whether the trace holds any lock event at all.
    pub has_lock_events: bool,
    /// Whether locks were recorded (`trapline run --record` without
    /// `locks` leaves them out).
    pub locks_recorded: bool,
    /// Recorded in production mode (`trapline run --production`): only
    /// contended acquisitions and the holds of each thread's first
    /// acquisition at a new pair of lock sites are in the trace.
    pub production_mode: bool,
    /// Counts.
    pub summary: DeadlocksSummary,
    /// Potential deadlocks first, then lock-order inversions.
    pub cycles: Vec<CycleReport>,
    /// The cycles grouped by the call sites of their edges: a pattern
    /// repeated over many locks (a loop over an array of locks in opposite
    /// orders) is one group of many cycles. In `cycles` order.
    pub cycle_groups: Vec<CycleGroup>,
    /// Threads that were stuck waiting for each other when the trace ended.
    pub actual_deadlocks: Vec<ActualDeadlock>,
    /// Lock misuse found in the trace.
    pub errors: Vec<LockError>,
    /// Events the agent could not record; null without an end record.
    pub events_lost: Option<u64>,
    /// Whether the trace was complete.
    pub trace: TraceStatus,
    /// Problems met while symbolizing, and a cut-short cycle search.
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeadlocksSummary {
    pub potential_deadlocks: u64,
    pub lock_order_inversions: u64,
    pub actual_deadlocks: u64,
    pub errors: u64,
    /// Distinct (held, requested) lock pairs in the lock graph.
    pub lock_graph_edges: u64,
    pub threads: u64,
}

/// A cycle in the lock graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CycleReport {
    /// `potential_deadlock` or `lock_order_inversion`.
    pub kind: &'static str,
    /// The locks, in cycle order (each edge goes from one to the next); 0
    /// for a thread (see the edges).
    #[serde(serialize_with = "hex_list")]
    pub locks: Vec<u64>,
    /// One edge per step.
    pub edges: Vec<EdgeReport>,
    /// How often the cycle was seen: the fewest times any of its edges was.
    pub occurrences: u64,
    /// Every other thread and call-site pair that takes one of the cycle's
    /// steps in its order (another function, another thread of a mirrored
    /// pair), with its count: `edges` holds one choice per step.
    pub other_edges: Vec<EdgeReport>,
    /// Index of its group in `cycle_groups`.
    pub group: usize,
}

/// Cycles whose edges are taken at the same call sites.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CycleGroup {
    /// `potential_deadlock` or `lock_order_inversion`.
    pub kind: &'static str,
    /// Indices into `cycles`, the first one shown in full in the text.
    pub cycles: Vec<usize>,
    /// Distinct threads of the group's edges.
    pub threads: Vec<u32>,
}

/// A thread holding `held` while it requested `requested`. Either may be a
/// thread (`_kind` `thread`, address 0): the edge's own thread, running
/// (`held_mode` `running`), or the thread it joins (`requested_mode`
/// `join`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EdgeReport {
    /// The thread (tid).
    pub thread: u32,
    #[serde(serialize_with = "serialize_hex")]
    pub held: u64,
    pub held_kind: &'static str,
    pub held_mode: &'static str,
    #[serde(serialize_with = "serialize_hex")]
    pub requested: u64,
    pub requested_kind: &'static str,
    pub requested_mode: &'static str,
    /// The thread joined (tid) when `requested_kind` is `thread`, else 0.
    pub joined: u32,
    /// Where the held lock was taken (a thread: where it was created).
    pub held_stack: Vec<FrameReport>,
    /// Where the next one was requested (a thread: where it was joined).
    pub requested_stack: Vec<FrameReport>,
    /// How often this edge was seen.
    pub count: u64,
}

/// Threads that waited for each other at the end of the trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ActualDeadlock {
    pub threads: Vec<Waiter>,
}

/// One stuck thread: what it waits for, and who holds that.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Waiter {
    pub thread: u32,
    /// `lock` (a lock request) or `join` (pthread_join of `held_by`).
    pub waits_in: &'static str,
    /// The lock (0 for a join).
    #[serde(serialize_with = "serialize_hex")]
    pub waits_for: u64,
    /// The lock's kind (`thread` for a join).
    pub lock_kind: &'static str,
    /// The mode asked for (`join` for a join).
    pub mode: &'static str,
    /// Where it asked for the lock, or called pthread_join.
    pub requested_stack: Vec<FrameReport>,
    /// The thread holding the lock, or the thread joined.
    pub held_by: u32,
    /// Where the holder took it (empty for a join).
    pub held_stack: Vec<FrameReport>,
}

fn hex_list<S: serde::Serializer>(v: &[u64], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for a in v {
        seq.serialize_element(&format!("{a:#x}"))?;
    }
    seq.end()
}

// ---------------------------------------------------------------------------
// Threads and segments.

/// Happens-before between thread segments.
#[derive(Default)]
struct Segments {
    /// Successors of each segment.
    next: Vec<Vec<usize>>,
    /// Current segment of each thread instance.
    current: Vec<usize>,
    /// tid -> its current thread instance.
    instance_of: HashMap<u32, usize, ahash::RandomState>,
    /// Creator's segment before each create id.
    created_from: HashMap<u64, usize>,
    /// (segment, create id): the segment follows the creator's (resolved at the end).
    after_create: Vec<(usize, u64)>,
    /// (segment, thread instance): the segment follows that thread's last segment.
    after_end: Vec<(usize, usize)>,
    reach: HashMap<(usize, usize), bool>,
    /// Each thread instance's tid.
    tids: Vec<u32>,
    /// Thread instance -> the create id it started from (pthread_create's
    /// threads only: the others have no node in the lock graph).
    create_id: HashMap<usize, u64>,
    /// Create id -> the stack of its pthread_create.
    create_stack: HashMap<u64, u32>,
}

impl Segments {
    fn new_segment(&mut self) -> usize {
        self.next.push(Vec::new());
        self.next.len() - 1
    }

    /// The thread instance of `tid`, created on first sight.
    fn instance(&mut self, tid: u32) -> usize {
        if let Some(&i) = self.instance_of.get(&tid) {
            return i;
        }
        self.start_instance(tid)
    }

    fn start_instance(&mut self, tid: u32) -> usize {
        let s = self.new_segment();
        self.current.push(s);
        self.tids.push(tid);
        let i = self.current.len() - 1;
        self.instance_of.insert(tid, i);
        i
    }

    /// Ends the current segment of `tid`'s instance; returns (old, new).
    fn split(&mut self, tid: u32) -> (usize, usize) {
        let i = self.instance(tid);
        let old = self.current[i];
        let new = self.new_segment();
        self.next[old].push(new);
        self.current[i] = new;
        (old, new)
    }

    fn apply(&mut self, tid: u32, ev: &Event) {
        match ev {
            Event::ThreadCreate {
                create_id, stack, ..
            } => {
                let (old, _) = self.split(tid);
                self.created_from.insert(*create_id, old);
                self.create_stack.insert(*create_id, *stack);
            }
            Event::ThreadStart { create_id, .. } => {
                let i = self.start_instance(tid);
                self.after_create.push((self.current[i], *create_id));
                self.create_id.insert(i, *create_id);
            }
            Event::Lock(LockEvent::Join { joined, .. }) if *joined != 0 => {
                let joined_instance = self.instance_of.get(joined).copied();
                let (_, new) = self.split(tid);
                if let Some(j) = joined_instance {
                    self.after_end.push((new, j));
                }
            }
            _ => {}
        }
    }

    /// Adds the create and join links once every thread's last segment is known.
    fn resolve(&mut self) {
        for (seg, id) in std::mem::take(&mut self.after_create) {
            if let Some(&from) = self.created_from.get(&id) {
                self.next[from].push(seg);
            }
        }
        for (seg, instance) in std::mem::take(&mut self.after_end) {
            let last = self.current[instance];
            if last != seg {
                self.next[last].push(seg);
            }
        }
    }

    /// The lock-graph node of `tid`'s current instance: only a thread
    /// pthread_create made has one (the main thread is not joined, and its
    /// requests, most of a single-threaded program's, add no edge).
    fn node(&mut self, tid: u32) -> Option<LockId> {
        let i = self.instance(tid);
        self.instance_node(i)
    }

    fn instance_node(&self, instance: usize) -> Option<LockId> {
        self.create_id
            .contains_key(&instance)
            .then(|| thread_node(instance))
    }

    /// Where the thread of a node was created (0 if unknown).
    fn created_at(&self, node: LockId) -> u32 {
        self.create_id
            .get(&(node.gen as usize))
            .and_then(|id| self.create_stack.get(id))
            .copied()
            .unwrap_or(0)
    }

    /// Whether segment `a` happens before segment `b`.
    fn before(&mut self, a: usize, b: usize) -> bool {
        if a == b {
            return false;
        }
        if let Some(&r) = self.reach.get(&(a, b)) {
            return r;
        }
        let mut seen = HashSet::new();
        let mut queue = VecDeque::from([a]);
        let mut found = false;
        while let Some(s) = queue.pop_front() {
            if s == b {
                found = true;
                break;
            }
            for &n in &self.next[s] {
                if seen.insert(n) {
                    queue.push_back(n);
                }
            }
        }
        self.reach.insert((a, b), found);
        found
    }
}

/// Locks a thread instance holds through its creator for its whole life:
/// the creator took them before the create and still held the same
/// acquisitions when it joined the instance (and, transitively, what guarded
/// the creator so). They serialize the instance's edges as its own holds
/// would: a parent that holds a gate lock around creating and joining a
/// child makes the child's lock orders as gated as its own.
#[derive(Default)]
struct InheritedGuards {
    /// create id -> the creator's instance and its holds at the create.
    at_create: HashMap<u64, (usize, Vec<Held>)>,
    /// instance -> its create id.
    created_by: HashMap<usize, u64>,
    /// instance -> the joiner's instance and its holds at the join.
    at_join: HashMap<usize, (usize, Vec<Held>)>,
    /// instance -> its inherited guard set (after `resolve`).
    guard: HashMap<usize, Vec<InheritedHold>>,
}

/// A lock a thread holds through the thread that created and joined it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct InheritedHold {
    lock: LockId,
    mode: LockMode,
    /// The instance that holds it (the creator, or its own creator...).
    holder: usize,
    /// When that hold began: with `holder`, which hold it is.
    since: u64,
}

impl InheritedGuards {
    /// Notes what an event tells: call after `Segments::apply` of the
    /// event and before `LockState::apply`.
    fn observe(&mut self, tid: u32, ev: &Event, segments: &mut Segments, state: &LockState) {
        match ev {
            Event::ThreadCreate { create_id, .. } => {
                let creator = segments.instance(tid);
                self.at_create
                    .insert(*create_id, (creator, state.held(tid).to_vec()));
            }
            Event::ThreadStart { create_id, .. } => {
                self.created_by.insert(segments.instance(tid), *create_id);
            }
            Event::Lock(LockEvent::Join { joined, .. }) if *joined != 0 => {
                // Segments::apply kept the joined instance for its tid.
                if let Some(&j) = segments.instance_of.get(joined) {
                    let joiner = segments.instance(tid);
                    self.at_join.insert(j, (joiner, state.held(tid).to_vec()));
                }
            }
            _ => {}
        }
    }

    /// Resolves every instance's guard set; a creator's instance is always
    /// numbered before its children's.
    fn resolve(&mut self, instances: usize) {
        for i in 0..instances {
            let Some((parent, created)) = self
                .created_by
                .get(&i)
                .and_then(|id| self.at_create.get(id))
            else {
                continue;
            };
            let Some((joiner, joined)) = self.at_join.get(&i) else {
                continue;
            };
            if joiner != parent {
                continue;
            }
            // The same acquisition at both ends: held throughout.
            let mut guard: Vec<InheritedHold> = created
                .iter()
                .filter(|c| joined.iter().any(|j| j.lock == c.lock && j.time == c.time))
                .map(|c| InheritedHold {
                    lock: c.lock,
                    mode: c.mode,
                    holder: *parent,
                    since: c.time,
                })
                .collect();
            if let Some(outer) = self.guard.get(parent) {
                guard.extend_from_slice(outer);
            }
            guard.sort();
            guard.dedup();
            if !guard.is_empty() {
                self.guard.insert(i, guard);
            }
        }
    }

    fn of(&self, instance: usize) -> &[InheritedHold] {
        self.guard.get(&instance).map_or(&[], Vec::as_slice)
    }
}

/// Whether a lock `instance` holds through its creator serializes it with
/// an edge of `other` holding `guard`: not when `other` is the holder
/// itself (its edges inside that hold are the hold, not a gate).
fn inherited_overlaps(
    inherited: &[InheritedHold],
    other: usize,
    guard: &[(LockId, LockMode)],
) -> bool {
    inherited.iter().any(|i| {
        i.holder != other
            && guard
                .iter()
                .any(|&(l, m)| l == i.lock && excludes(i.mode, m))
    })
}

/// Whether two inherited guard sets serialize their threads: a common lock
/// by two different holds (one hold, held around two siblings, does not
/// keep them apart).
fn inherited_both_overlap(a: &[InheritedHold], b: &[InheritedHold]) -> bool {
    a.iter().any(|i| {
        b.iter().any(|j| {
            i.lock == j.lock
                && (i.holder, i.since) != (j.holder, j.since)
                && excludes(i.mode, j.mode)
        })
    })
}

// ---------------------------------------------------------------------------
// The lock graph.

/// The address of a thread's node: no lock lives at the last address.
const THREAD_NODE: u64 = u64::MAX;

/// The node of thread instance `instance`: it holds the thread's run, and
/// a pthread_join of the thread requests it.
fn thread_node(instance: usize) -> LockId {
    LockId {
        addr: THREAD_NODE,
        gen: instance as u32,
    }
}

fn is_thread(node: LockId) -> bool {
    node.addr == THREAD_NODE
}

/// One labelled edge of the lock graph, with how often it was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Edge {
    held: LockId,
    requested: LockId,
    tid: u32,
    /// Thread instance (a reused tid is another thread).
    instance: usize,
    segment: usize,
    /// Sorted guard set: every lock held at the request, with its mode
    /// (its number in [`LockGraph::guards`]).
    guard: u32,
    held_kind: LockKind,
    held_mode: LockMode,
    requested_kind: LockKind,
    requested_mode: LockMode,
    held_stack: u32,
    requested_stack: u32,
}

/// A guard set: the locks held at a request, with their modes, sorted.
type Guard = Vec<(LockId, LockMode)>;

#[derive(Default)]
struct LockGraph {
    edges: Vec<(Edge, u64)>,
    /// Looked up once per lock request: aHash, as SipHash over the guard
    /// set took a fifth of a pass (memcached's trace). Each edge's number
    /// in `edges` and how often it was seen: counting here, where the
    /// lookup has just read the entry, spares a cache miss on `edges` per
    /// request; [`LockGraph::settle`] copies the counts there at the end.
    index: HashMap<Edge, (usize, u64), ahash::RandomState>,
    /// The distinct guard sets, numbered: an edge holds its set's number,
    /// so adding an edge already seen neither allocates nor hashes a set
    /// (it took 45% of a deadlocks pass on memcached's trace).
    guards: Vec<Guard>,
    guard_ids: HashMap<Guard, u32, ahash::RandomState>,
    /// The guard set being looked up (kept to reuse its buffer).
    scratch: Guard,
    /// (held, requested) -> indices into `edges`.
    pairs: HashMap<(LockId, LockId), Vec<usize>>,
    succ: HashMap<LockId, Vec<LockId>>,
}

impl LockGraph {
    /// The number of the guard set of a request made holding `held`,
    /// numbering the set if it is new.
    fn guard_of(&mut self, held: &[Held]) -> u32 {
        let mut guard = std::mem::take(&mut self.scratch);
        guard.clear();
        guard.extend(held.iter().map(|h| (h.lock, h.mode)));
        guard.sort();
        guard.dedup();
        let id = match self.guard_ids.get(guard.as_slice()) {
            Some(&id) => id,
            None => {
                let id = self.guards.len() as u32;
                self.guards.push(guard.clone());
                self.guard_ids.insert(guard.clone(), id);
                id
            }
        };
        self.scratch = guard;
        id
    }

    fn guard(&self, id: u32) -> &[(LockId, LockMode)] {
        &self.guards[id as usize]
    }

    fn add(&mut self, e: Edge) {
        if let Some((_, seen)) = self.index.get_mut(&e) {
            *seen += 1;
            return;
        }
        let i = self.edges.len();
        let pair = (e.held, e.requested);
        let list = self.pairs.entry(pair).or_default();
        if list.is_empty() {
            self.succ.entry(e.held).or_default().push(e.requested);
        }
        list.push(i);
        self.index.insert(e, (i, 1));
        self.edges.push((e, 0));
    }

    /// Copies the counts into `edges`, once every request is added.
    fn settle(&mut self) {
        for &(i, seen) in self.index.values() {
            self.edges[i].1 = seen;
        }
    }

    /// Simple cycles, each once (rotated to start at its smallest lock),
    /// and whether the search was cut short. A cycle lies within one
    /// strongly connected component, so the search from each lock only
    /// enters locks of its component: locks always taken in one order (no
    /// cycle) cost nothing, however deeply they nest.
    fn cycles(&self) -> (Vec<Vec<LockId>>, Option<SearchCut>) {
        let component = self.components();
        let mut nodes: Vec<LockId> = self.succ.keys().copied().collect();
        nodes.sort();
        let mut search = CycleSearch {
            graph: self,
            component: &component,
            out: Vec::new(),
            steps: 0,
            cut: None,
        };
        for &start in &nodes {
            let mut path = vec![start];
            let mut on_path = HashSet::from([start]);
            search.from(start, start, &mut path, &mut on_path);
            if matches!(search.cut, Some(SearchCut::Cycles | SearchCut::Steps)) {
                break;
            }
        }
        (search.out, search.cut)
    }

    /// Strongly connected component of every lock (Kosaraju, iterative).
    fn components(&self) -> HashMap<LockId, usize> {
        let mut nodes: Vec<LockId> = self.succ.keys().copied().collect();
        nodes.sort();
        let mut pred: HashMap<LockId, Vec<LockId>> = HashMap::new();
        for (&from, tos) in &self.succ {
            for &to in tos {
                pred.entry(to).or_default().push(from);
            }
        }
        // Finishing order of a depth-first search of the graph.
        let mut seen: HashSet<LockId> = HashSet::new();
        let mut order = Vec::new();
        for &root in &nodes {
            if !seen.insert(root) {
                continue;
            }
            let mut stack = vec![(root, 0usize)];
            while let Some((node, i)) = stack.pop() {
                let next = self.succ.get(&node).and_then(|v| v.get(i)).copied();
                match next {
                    Some(n) => {
                        stack.push((node, i + 1));
                        if seen.insert(n) {
                            stack.push((n, 0));
                        }
                    }
                    None => order.push(node),
                }
            }
        }
        // Components: searches of the reversed graph in reverse finishing order.
        let mut component = HashMap::new();
        for &root in order.iter().rev() {
            if component.contains_key(&root) {
                continue;
            }
            let id = component.len();
            let mut stack = vec![root];
            component.insert(root, id);
            while let Some(node) = stack.pop() {
                for &p in pred.get(&node).into_iter().flatten() {
                    if let std::collections::hash_map::Entry::Vacant(v) = component.entry(p) {
                        v.insert(id);
                        stack.push(p);
                    }
                }
            }
        }
        component
    }
}

/// Steps the cycle search may take before it stops (and says so).
pub const MAX_SEARCH_STEPS: u64 = 10_000_000;

/// Which bound cut the cycle search short.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SearchCut {
    /// [`MAX_CYCLES`] cycles found: the search stopped.
    Cycles,
    /// [`MAX_SEARCH_STEPS`] steps taken: the search stopped.
    Steps,
    /// A path reached [`MAX_CYCLE`] locks: longer cycles were not followed;
    /// the search went on with the rest.
    Length,
}

impl SearchCut {
    fn warning(self) -> String {
        match self {
            SearchCut::Cycles => format!(
                "the lock graph has too many cycles to list: the search stopped after {MAX_CYCLES} cycles, and only the cycles found were checked"
            ),
            SearchCut::Steps => format!(
                "the lock graph is too large to search whole: the search stopped after {MAX_SEARCH_STEPS} steps, and only the cycles found were checked"
            ),
            SearchCut::Length => format!(
                "cycles through more than {MAX_CYCLE} locks were not searched; every shorter cycle was"
            ),
        }
    }
}

struct CycleSearch<'a> {
    graph: &'a LockGraph,
    component: &'a HashMap<LockId, usize>,
    out: Vec<Vec<LockId>>,
    steps: u64,
    cut: Option<SearchCut>,
}

impl CycleSearch<'_> {
    fn from(
        &mut self,
        start: LockId,
        at: LockId,
        path: &mut Vec<LockId>,
        on_path: &mut HashSet<LockId>,
    ) {
        let Some(next) = self.graph.succ.get(&at) else {
            return;
        };
        let mut next = next.clone();
        next.sort();
        let home = self.component.get(&start);
        for n in next {
            self.steps += 1;
            if matches!(self.cut, Some(SearchCut::Cycles | SearchCut::Steps)) {
                return;
            }
            if self.steps > MAX_SEARCH_STEPS {
                self.cut = Some(SearchCut::Steps);
                return;
            }
            if n == start && path.len() >= 2 {
                if self.out.len() == MAX_CYCLES {
                    self.cut = Some(SearchCut::Cycles);
                    return;
                }
                self.out.push(path.clone());
            } else if n > start && self.component.get(&n) == home && !on_path.contains(&n) {
                if path.len() >= MAX_CYCLE {
                    self.cut.get_or_insert(SearchCut::Length);
                    continue;
                }
                path.push(n);
                on_path.insert(n);
                self.from(start, n, path, on_path);
                on_path.remove(&n);
                path.pop();
            }
        }
    }
}

/// Which kind of cycle an assignment of edges is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CycleKind {
    PotentialDeadlock,
    LockOrderInversion,
}

/// Edge choices tried per cycle and kind before the check gives up (and
/// says so): many labelled edges per lock pair make the choice exponential.
const MAX_CHOICES: u64 = 1_000_000;

struct Checker<'a> {
    graph: &'a LockGraph,
    segments: &'a mut Segments,
    inherited: &'a InheritedGuards,
    /// Choices tried for the current cycle and kind.
    tried: u64,
    /// Cycles whose check gave up.
    gave_up: u64,
}

impl Checker<'_> {
    /// Edges (one per step of `cycle`) forming a cycle of `kind`, if any.
    fn find(&mut self, cycle: &[LockId], kind: CycleKind) -> Option<Vec<usize>> {
        let mut chosen = Vec::with_capacity(cycle.len());
        self.tried = 0;
        let found = self.choose(cycle, kind, &mut chosen);
        if !found && self.tried > MAX_CHOICES {
            self.gave_up += 1;
        }
        found.then_some(chosen)
    }

    fn choose(&mut self, cycle: &[LockId], kind: CycleKind, chosen: &mut Vec<usize>) -> bool {
        let step = chosen.len();
        if step == cycle.len() {
            // The last step's request meets the first step's hold.
            let last = &self.graph.edges[chosen[step - 1]].0;
            let first = &self.graph.edges[chosen[0]].0;
            return blocks(last, first);
        }
        let pair = (cycle[step], cycle[(step + 1) % cycle.len()]);
        let Some(candidates) = self.graph.pairs.get(&pair) else {
            return false;
        };
        for &c in candidates {
            if self.compatible(chosen, c, kind) {
                chosen.push(c);
                if self.choose(cycle, kind, chosen) {
                    return true;
                }
                chosen.pop();
            }
        }
        false
    }

    fn compatible(&mut self, chosen: &[usize], c: usize, kind: CycleKind) -> bool {
        let inherited = self.inherited;
        self.tried += 1;
        if self.tried > MAX_CHOICES {
            return false;
        }
        let e = &self.graph.edges[c].0;
        if let Some(&prev) = chosen.last() {
            if !blocks(&self.graph.edges[prev].0, e) {
                return false;
            }
        }
        let e_inherited = inherited.of(e.instance);
        for &o in chosen {
            let f = &self.graph.edges[o].0;
            let f_inherited = inherited.of(f.instance);
            let (e_guard, f_guard) = (self.graph.guard(e.guard), self.graph.guard(f.guard));
            if guards_overlap(e_guard, f_guard)
                || inherited_overlaps(f_inherited, e.instance, e_guard)
                || inherited_overlaps(e_inherited, f.instance, f_guard)
                || inherited_both_overlap(e_inherited, f_inherited)
            {
                return false;
            }
            match kind {
                CycleKind::PotentialDeadlock => {
                    if f.instance == e.instance
                        || self.segments.before(f.segment, e.segment)
                        || self.segments.before(e.segment, f.segment)
                    {
                        return false;
                    }
                }
                CycleKind::LockOrderInversion => {
                    if f.instance != e.instance {
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// Whether two guard sets share a lock that serializes them: one held
/// exclusively by at least one of the two (two read holds exclude nothing).
fn guards_overlap(a: &[(LockId, LockMode)], b: &[(LockId, LockMode)]) -> bool {
    a.iter()
        .any(|&(l, m)| b.iter().any(|&(k, n)| l == k && excludes(m, n)))
}

/// Whether two holds of one lock exclude each other (not two read holds).
fn excludes(a: LockMode, b: LockMode) -> bool {
    !(a == LockMode::Shared && b == LockMode::Shared)
}

/// Whether `request`'s wait for its lock can be blocked by `hold` (the next
/// edge, which holds that lock): not when both are read holds of an rwlock.
fn blocks(request: &Edge, hold: &Edge) -> bool {
    !(request.requested_mode == LockMode::Shared && hold.held_mode == LockMode::Shared)
}

// ---------------------------------------------------------------------------
// The analysis.

/// Analyses a trace. Fails only when the input is not a readable trace at all.
pub fn analyze<R: TraceInput>(input: &mut R) -> Result<DeadlocksReport, TraceError> {
    crate::pass::run(input, |_| DeadlocksAnalysis::default())
}

/// The deadlocks analysis as a [`Pass`], to share a read of the trace.
#[derive(Default)]
pub struct DeadlocksAnalysis {
    /// Frames as addresses only, no module read (see [`Self::counting`]).
    addresses_only: bool,
    facts: Facts,
    state: LockState,
    segments: Segments,
    graph: LockGraph,
    inherited: InheritedGuards,
    threads: HashSet<u32>,
}

impl DeadlocksAnalysis {
    /// The pass for a report that is only counted: stacks are not symbolized.
    pub fn counting() -> Self {
        DeadlocksAnalysis {
            addresses_only: true,
            ..DeadlocksAnalysis::default()
        }
    }
}

impl Pass for DeadlocksAnalysis {
    type Report = DeadlocksReport;
    fn observe(&mut self, m: &MergedEvent) {
        self.facts.observe(m.time, &m.event);
        self.state.at(m);
        if let Event::Lock(LockEvent::Join { joined, stack, .. }) = &m.event {
            // The joiner waited in the segment the join ends.
            let joined = self
                .segments
                .instance_of
                .get(joined)
                .filter(|_| *joined != 0);
            if let Some(node) = joined.and_then(|&j| self.segments.instance_node(j)) {
                let held = self.state.held(m.tid).to_vec();
                let join = Request {
                    node,
                    kind: LockKind::Unknown,
                    mode: LockMode::Exclusive,
                    stack: *stack,
                };
                add_requests(&mut self.graph, &mut self.segments, m.tid, &held, join);
            }
        }
        self.segments.apply(m.tid, &m.event);
        self.inherited
            .observe(m.tid, &m.event, &mut self.segments, &self.state);
        if let Event::Lock(LockEvent::Acquire { op, stack, .. }) = &m.event {
            self.threads.insert(m.tid);
            let (op, stack) = (*op, *stack);
            let held_before: Vec<_> = self.state.held(m.tid).to_vec();
            if let Applied::Acquired { held, nested } = self.state.apply(m.tid, &m.event) {
                let waits = matches!(op, LockOp::Blocking | LockOp::CondWait);
                let reentry = nested || held_before.iter().any(|h| h.lock == held.lock);
                if waits && !reentry {
                    let request = Request {
                        node: held.lock,
                        kind: held.kind,
                        mode: held.mode,
                        stack,
                    };
                    add_requests(
                        &mut self.graph,
                        &mut self.segments,
                        m.tid,
                        &held_before,
                        request,
                    );
                }
            }
            return;
        }
        self.state.apply(m.tid, &m.event);
    }
    fn needs(&self, chunk: ChunkSummary) -> bool {
        LockState::needs(chunk)
    }
    fn skipped(&mut self, chunk: &ChunkEntry, start: u64) {
        self.facts.skipped_chunk(chunk, start);
    }
    fn use_index(&mut self, file: &IndexFile) {
        self.state.use_index(file);
    }
    fn learned(&self) -> Learned {
        self.state.learned()
    }
    fn finish(
        self,
        index: &TraceIndex,
        stopped: ReadStatus,
    ) -> Result<DeadlocksReport, TraceError> {
        Ok(deadlocks_report(self, index, stopped))
    }
}

/// The report, from the pass's state once the trace is read.
fn deadlocks_report(
    pass: DeadlocksAnalysis,
    index: &TraceIndex,
    stopped: ReadStatus,
) -> DeadlocksReport {
    let DeadlocksAnalysis {
        addresses_only,
        facts,
        state,
        mut segments,
        mut graph,
        mut inherited,
        threads,
    } = pass;
    graph.settle();
    segments.resolve();
    inherited.resolve(segments.current.len());

    let mut sym = match addresses_only {
        true => StackSymbolizer::addresses_only(),
        false => facts.symbolizer(),
    };
    let mut warnings = Vec::new();
    let nodes = ThreadNodes::of(&segments);
    let (lock_cycles, cut) = graph.cycles();
    if let Some(cut) = cut {
        warnings.push(cut.warning());
    }
    let mut cycles = Vec::new();
    let mut checker = Checker {
        graph: &graph,
        segments: &mut segments,
        inherited: &inherited,
        tried: 0,
        gave_up: 0,
    };
    let mut sites = Vec::new();
    for cycle in &lock_cycles {
        for (kind, name) in [
            (CycleKind::PotentialDeadlock, "potential_deadlock"),
            (CycleKind::LockOrderInversion, "lock_order_inversion"),
        ] {
            if let Some(chosen) = checker.find(cycle, kind) {
                let report = cycle_report(name, cycle, &chosen, &graph, &nodes, &facts, &mut sym);
                cycles.push(report);
                sites.push(cycle_sites(cycle, &graph));
                break;
            }
        }
    }
    if checker.gave_up > 0 {
        warnings.push(format!(
            "{} lock cycle checks gave up after {MAX_CHOICES} choices of edges: those cycles are not reported",
            checker.gave_up
        ));
    }
    // Potential deadlocks first (stable: cycles were found in lock order).
    let mut order: Vec<usize> = (0..cycles.len()).collect();
    order.sort_by_key(|&i| cycles[i].kind != "potential_deadlock");
    let mut cycles: Vec<CycleReport> = order.iter().map(|&i| cycles[i].clone()).collect();
    let sites: Vec<Vec<(u32, u32)>> = order.iter().map(|&i| sites[i].clone()).collect();
    let cycle_groups = group_cycles(&mut cycles, &sites);

    let actual_deadlocks = actual_deadlocks(&state, &facts, &mut sym);
    let errors = state.errors(&facts.stacks, &mut sym);
    warnings.extend(sym.warnings());
    let count = |k: &str| cycles.iter().filter(|c| c.kind == k).count() as u64;
    DeadlocksReport {
        process: facts.process_report(),
        has_lock_events: state.saw_lock_events,
        locks_recorded: !facts.locks_off,
        production_mode: facts.production.is_some(),
        summary: DeadlocksSummary {
            potential_deadlocks: count("potential_deadlock"),
            lock_order_inversions: count("lock_order_inversion"),
            actual_deadlocks: actual_deadlocks.len() as u64,
            errors: errors.len() as u64,
            lock_graph_edges: graph
                .pairs
                .keys()
                .filter(|(a, b)| !is_thread(*a) && !is_thread(*b))
                .count() as u64,
            threads: threads.len() as u64,
        },
        cycles,
        cycle_groups,
        actual_deadlocks,
        errors,
        events_lost: facts.events_lost(),
        trace: facts.trace_status(index, stopped),
        warnings,
    }
}

/// What a blocking call waits for: a lock, or (pthread_join) a thread's
/// node, with the call's stack.
struct Request {
    node: LockId,
    kind: LockKind,
    mode: LockMode,
    stack: u32,
}

/// Adds the edges of `tid` waiting for `r` while it holds `held`: from each
/// lock held, and from the thread's own node (its run, which a join of it
/// waits for).
fn add_requests(
    graph: &mut LockGraph,
    segments: &mut Segments,
    tid: u32,
    held: &[Held],
    r: Request,
) {
    let guard = graph.guard_of(held);
    let instance = segments.instance(tid);
    let segment = segments.current[instance];
    let own = segments
        .node(tid)
        .map(|node| (node, LockKind::Unknown, LockMode::Exclusive, 0));
    let holds = held.iter().map(|h| (h.lock, h.kind, h.mode, h.stack));
    for (from, kind, mode, stack) in own.into_iter().chain(holds) {
        graph.add(Edge {
            held: from,
            requested: r.node,
            tid,
            instance,
            segment,
            guard,
            held_kind: kind,
            held_mode: mode,
            requested_kind: r.kind,
            requested_mode: r.mode,
            held_stack: stack,
            requested_stack: r.stack,
        });
    }
}

/// The threads behind the graph's thread nodes: tid and creation stack of
/// each instance.
struct ThreadNodes {
    tid: Vec<u32>,
    created_at: Vec<u32>,
}

impl ThreadNodes {
    fn of(segments: &Segments) -> ThreadNodes {
        ThreadNodes {
            tid: segments.tids.clone(),
            created_at: (0..segments.tids.len())
                .map(|i| segments.created_at(thread_node(i)))
                .collect(),
        }
    }
}

fn cycle_report(
    kind: &'static str,
    cycle: &[LockId],
    chosen: &[usize],
    graph: &LockGraph,
    nodes: &ThreadNodes,
    facts: &Facts,
    sym: &mut StackSymbolizer,
) -> CycleReport {
    let address = |node: LockId| if is_thread(node) { 0 } else { node.addr };
    let kind_name = |node: LockId, kind: LockKind| {
        if is_thread(node) {
            "thread"
        } else {
            kind.name()
        }
    };
    // A thread's node is held while it runs and requested by a join.
    let mode = |node: LockId, kind: LockKind, mode: LockMode, thread: &'static str| {
        if is_thread(node) {
            thread
        } else {
            mode_name(kind, mode)
        }
    };
    let mut edge_report = |e: &Edge, count: u64| EdgeReport {
        thread: e.tid,
        held: address(e.held),
        held_kind: kind_name(e.held, e.held_kind),
        held_mode: mode(e.held, e.held_kind, e.held_mode, "running"),
        requested: address(e.requested),
        requested_kind: kind_name(e.requested, e.requested_kind),
        requested_mode: mode(e.requested, e.requested_kind, e.requested_mode, "join"),
        joined: if is_thread(e.requested) {
            nodes.tid[e.requested.gen as usize]
        } else {
            0
        },
        held_stack: if is_thread(e.held) {
            sym.stack(&facts.stacks, nodes.created_at[e.held.gen as usize])
        } else {
            sym.stack(&facts.stacks, e.held_stack)
        },
        requested_stack: sym.stack(&facts.stacks, e.requested_stack),
        count,
    };
    let edges: Vec<EdgeReport> = chosen
        .iter()
        .map(|&i| {
            let (e, count) = &graph.edges[i];
            edge_report(e, *count)
        })
        .collect();
    // The other edges of each step, merged by thread and call sites (their
    // guard sets and segments may differ): a representative and the sum.
    let same_taker = |a: &Edge, b: &Edge| {
        (a.tid, a.held_stack, a.requested_stack, a.held, a.requested)
            == (b.tid, b.held_stack, b.requested_stack, b.held, b.requested)
    };
    let mut others: Vec<(usize, u64)> = Vec::new();
    for (step, &c) in chosen.iter().enumerate() {
        let pick = &graph.edges[c].0;
        let pair = (cycle[step], cycle[(step + 1) % cycle.len()]);
        for &i in graph.pairs.get(&pair).into_iter().flatten() {
            let (e, count) = &graph.edges[i];
            if same_taker(e, pick) {
                continue;
            }
            match others
                .iter_mut()
                .find(|(r, _)| same_taker(&graph.edges[*r].0, e))
            {
                Some((_, n)) => *n += count,
                None => others.push((i, *count)),
            }
        }
    }
    let other_edges = others
        .iter()
        .map(|&(i, count)| edge_report(&graph.edges[i].0, count))
        .collect();
    CycleReport {
        kind,
        locks: cycle.iter().map(|&l| address(l)).collect(),
        occurrences: edges.iter().map(|e| e.count).min().unwrap_or(0),
        edges,
        other_edges,
        group: 0,
    }
}

/// A cycle's kind and its sorted call-site pairs.
type GroupKey<'a> = (&'static str, &'a [(u32, u32)]);

/// Groups cycles of one kind whose edges (chosen and other) were taken at
/// the same call sites, in `cycles` order; sets each cycle's `group`.
fn group_cycles(cycles: &mut [CycleReport], sites: &[Vec<(u32, u32)>]) -> Vec<CycleGroup> {
    let mut groups: Vec<CycleGroup> = Vec::new();
    let mut by_key: HashMap<GroupKey, usize> = HashMap::new();
    for (i, c) in cycles.iter_mut().enumerate() {
        let g = *by_key.entry((c.kind, &sites[i])).or_insert_with(|| {
            groups.push(CycleGroup {
                kind: c.kind,
                cycles: Vec::new(),
                threads: Vec::new(),
            });
            groups.len() - 1
        });
        c.group = g;
        let group = &mut groups[g];
        group.cycles.push(i);
        for e in c.edges.iter().chain(&c.other_edges) {
            if !group.threads.contains(&e.thread) {
                group.threads.push(e.thread);
            }
        }
    }
    for g in &mut groups {
        g.threads.sort_unstable();
    }
    groups
}

/// The call-site pairs (held stack, requested stack) of a cycle's edges,
/// sorted: its grouping key.
fn cycle_sites(cycle: &[LockId], graph: &LockGraph) -> Vec<(u32, u32)> {
    let mut sites: Vec<(u32, u32)> = (0..cycle.len())
        .flat_map(|step| {
            let pair = (cycle[step], cycle[(step + 1) % cycle.len()]);
            graph.pairs.get(&pair).into_iter().flatten()
        })
        .map(|&i| {
            (
                graph.edges[i].0.held_stack,
                graph.edges[i].0.requested_stack,
            )
        })
        .collect();
    sites.sort_unstable();
    sites.dedup();
    sites
}

/// Wait-for cycles among the threads still waiting at the end of the trace:
/// in a lock request, for the lock's holder, or in pthread_join, for the
/// thread joined.
fn actual_deadlocks(
    state: &LockState,
    facts: &Facts,
    sym: &mut StackSymbolizer,
) -> Vec<ActualDeadlock> {
    let pending: HashMap<u32, _> = state.pending().into_iter().collect();
    // Each waiting thread -> the thread it waits for (the first holder that
    // excludes it: any holder for a write request, a writer for a read one)
    // and how it waits.
    let mut waits_for: HashMap<u32, (u32, Wait)> = HashMap::new();
    for (&tid, p) in &pending {
        let holder = state
            .holders(p.lock)
            .into_iter()
            .find(|(_, h)| p.mode == LockMode::Exclusive || h.mode == LockMode::Exclusive);
        if let Some((holder, h)) = holder {
            waits_for.insert(tid, (holder, Wait::Lock(*p, h)));
        }
    }
    for (tid, j) in state.pending_joins() {
        if j.joined != 0 {
            waits_for.entry(tid).or_insert((j.joined, Wait::Join(j)));
        }
    }
    let mut reported: HashSet<u32> = HashSet::new();
    let mut out = Vec::new();
    let mut tids: Vec<u32> = waits_for.keys().copied().collect();
    tids.sort_unstable();
    for start in tids {
        if reported.contains(&start) {
            continue;
        }
        // Follow the chain; a cycle is found when a thread repeats.
        let mut chain = vec![start];
        let mut at = start;
        let cycle_start = loop {
            let Some(&(next, _)) = waits_for.get(&at) else {
                break None;
            };
            if let Some(pos) = chain.iter().position(|&t| t == next) {
                break Some(pos);
            }
            chain.push(next);
            at = next;
        };
        let Some(pos) = cycle_start else {
            continue;
        };
        let members = &chain[pos..];
        if members.iter().any(|t| reported.contains(t)) {
            continue;
        }
        reported.extend(members.iter().copied());
        let threads = members
            .iter()
            .map(|tid| match waits_for[tid] {
                (holder, Wait::Lock(p, h)) => Waiter {
                    thread: *tid,
                    waits_in: "lock",
                    waits_for: p.lock.addr,
                    lock_kind: p.kind.name(),
                    mode: mode_name(p.kind, p.mode),
                    requested_stack: sym.stack(&facts.stacks, p.stack),
                    held_by: holder,
                    held_stack: sym.stack(&facts.stacks, h.stack),
                },
                (joined, Wait::Join(j)) => Waiter {
                    thread: *tid,
                    waits_in: "join",
                    waits_for: 0,
                    lock_kind: "thread",
                    mode: "join",
                    requested_stack: sym.stack(&facts.stacks, j.stack),
                    held_by: joined,
                    held_stack: Vec::new(),
                },
            })
            .collect();
        out.push(ActualDeadlock { threads });
    }
    out
}

/// Groups of cycles the text shows (the JSON has all).
const MAX_GROUPS_SHOWN: usize = 20;
/// Other cycles of a group listed by their locks in the text.
const MAX_SIBLINGS_SHOWN: usize = 5;

/// One edge of a cycle, with its stacks, as text.
fn edge_text(out: &mut String, p: &str, e: &EdgeReport) {
    let (holds, held_at) = if e.held_kind == "thread" {
        ("runs until joined".to_owned(), "thread created at:")
    } else {
        let held = format!("holds {} {:#x} ({})", e.held_kind, e.held, e.held_mode);
        (held, "held lock taken at:")
    };
    let (requests, requested_at) = if e.requested_kind == "thread" {
        (
            format!("joins thread {}", e.joined),
            "pthread_join called at:",
        )
    } else {
        let requested = format!(
            "requests {} {:#x} ({})",
            e.requested_kind, e.requested, e.requested_mode
        );
        (requested, "next lock requested at:")
    };
    writeln!(
        out,
        "{p}  thread {} {holds} and {requests}, {} time{}",
        e.thread,
        e.count,
        plural(e.count)
    )
    .unwrap();
    writeln!(out, "{p}    {held_at}").unwrap();
    stack_text(out, p, "      ", &e.held_stack);
    writeln!(out, "{p}    {requested_at}").unwrap();
    stack_text(out, p, "      ", &e.requested_stack);
}

/// How a stuck thread waits.
#[derive(Clone, Copy)]
enum Wait {
    /// For a lock: its request, and the hold that excludes it.
    Lock(crate::lockstate::Pending, crate::lockstate::Held),
    /// In pthread_join.
    Join(crate::lockstate::PendingJoin),
}

/// Renders the report as text.
pub fn render_text(r: &DeadlocksReport) -> String {
    let p = prefix(&r.process);
    let mut out = String::new();
    writeln!(
        out,
        "{p}trapline deadlocks: lock-order analysis (generalized Goodlock)"
    )
    .unwrap();
    writeln!(out, "{p}Command: {}", command_text(&r.process)).unwrap();
    if r.production_mode {
        writeln!(out, "{p}PRODUCTION MODE: each thread records each pair of lock sites (held, requested) once, with the holds it was taken under, and every contended wait: \"seen\" counts recorded pairs, not every acquisition").unwrap();
    }
    if let Some(why) = crate::report::no_lock_events(
        r.locks_recorded,
        r.has_lock_events,
        r.trace.attached.is_some(),
    ) {
        writeln!(out, "{p}{why}").unwrap();
        footer_text(&mut out, &p, r.events_lost, &r.trace);
        return out;
    }
    let s = &r.summary;
    writeln!(
        out,
        "{p}Found: {} potential deadlock{}, {} lock-order inversion{}, {} actual deadlock{}, {} error{} ({} lock pairs ordered, {} threads)",
        s.potential_deadlocks,
        plural(s.potential_deadlocks),
        s.lock_order_inversions,
        plural(s.lock_order_inversions),
        s.actual_deadlocks,
        plural(s.actual_deadlocks),
        s.errors,
        plural(s.errors),
        s.lock_graph_edges,
        s.threads
    )
    .unwrap();
    writeln!(out, "{p}").unwrap();
    for (i, d) in r.actual_deadlocks.iter().enumerate() {
        writeln!(
            out,
            "{p}ACTUAL DEADLOCK #{} ({} threads stuck when the trace ended):",
            i + 1,
            d.threads.len()
        )
        .unwrap();
        for w in &d.threads {
            if w.waits_in == "join" {
                writeln!(
                    out,
                    "{p}  thread {} waits in pthread_join for thread {} to end",
                    w.thread, w.held_by
                )
                .unwrap();
                writeln!(out, "{p}    joined at:").unwrap();
                stack_text(&mut out, &p, "      ", &w.requested_stack);
                continue;
            }
            writeln!(
                out,
                "{p}  thread {} waits for {} {:#x} ({}), held by thread {}",
                w.thread, w.lock_kind, w.waits_for, w.mode, w.held_by
            )
            .unwrap();
            writeln!(out, "{p}    requested at:").unwrap();
            stack_text(&mut out, &p, "      ", &w.requested_stack);
            writeln!(out, "{p}    taken by thread {} at:", w.held_by).unwrap();
            stack_text(&mut out, &p, "      ", &w.held_stack);
        }
        writeln!(out, "{p}").unwrap();
    }
    for (g, group) in r.cycle_groups.iter().enumerate().take(MAX_GROUPS_SHOWN) {
        let c = &r.cycles[group.cycles[0]];
        let title = if c.kind == "potential_deadlock" {
            "POTENTIAL DEADLOCK"
        } else {
            "LOCK-ORDER INVERSION (one thread; lower severity)"
        };
        // A thread node is named by the edge out of it, the thread's own.
        let locks = |c: &CycleReport| {
            let mut v: Vec<String> = c
                .locks
                .iter()
                .zip(&c.edges)
                .map(|(a, e)| match e.held_kind {
                    "thread" => format!("thread {}", e.thread),
                    _ => format!("{a:#x}"),
                })
                .collect();
            v.push(v[0].clone());
            v.join(" -> ")
        };
        writeln!(
            out,
            "{p}{title} #{}: {} (seen {} time{})",
            g + 1,
            locks(c),
            c.occurrences,
            plural(c.occurrences)
        )
        .unwrap();
        if group.cycles.len() > 1 {
            writeln!(
                out,
                "{p}  one of {} cycles through the same call sites, by thread{} {}",
                group.cycles.len(),
                plural(group.threads.len() as u64),
                group
                    .threads
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
            .unwrap();
        }
        for e in &c.edges {
            edge_text(&mut out, &p, e);
        }
        if !c.other_edges.is_empty() {
            writeln!(out, "{p}  also in these orders:").unwrap();
            for e in &c.other_edges {
                edge_text(&mut out, &p, e);
            }
        }
        if group.cycles.len() > 1 {
            let shown = group.cycles.len().min(MAX_SIBLINGS_SHOWN + 1);
            writeln!(out, "{p}  the same between other locks:").unwrap();
            for &i in &group.cycles[1..shown] {
                writeln!(out, "{p}    {}", locks(&r.cycles[i])).unwrap();
            }
            if group.cycles.len() > shown {
                writeln!(
                    out,
                    "{p}    ... and {} more (--format json lists every cycle)",
                    group.cycles.len() - shown
                )
                .unwrap();
            }
        }
        writeln!(out, "{p}").unwrap();
    }
    if r.cycle_groups.len() > MAX_GROUPS_SHOWN {
        writeln!(
            out,
            "{p}... {} more groups of cycles not shown (--format json lists every cycle)",
            r.cycle_groups.len() - MAX_GROUPS_SHOWN
        )
        .unwrap();
        writeln!(out, "{p}").unwrap();
    }
    if r.cycles.is_empty() && r.actual_deadlocks.is_empty() {
        writeln!(out, "{p}No lock-order cycle found.").unwrap();
        writeln!(out, "{p}").unwrap();
    }
    errors_text(&mut out, &p, &r.errors);
    warnings_text(&mut out, &p, &r.warnings);
    footer_text(&mut out, &p, r.events_lost, &r.trace);
    out
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
