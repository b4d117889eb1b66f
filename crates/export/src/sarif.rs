//! `leaks` and `deadlocks` findings as SARIF 2.1.0, the OASIS format that
//! code-scanning services and editors read (GitHub code scanning, the VS
//! Code SARIF viewer).
//!
//! One result per finding the report counts: a loss record, an allocation
//! error at one stack, a growing or stale site, a lock-order cycle, an
//! actual deadlock, a lock misuse record. Its `ruleId` is the report's JSON
//! `kind`, and its level is `error` exactly when `--error-exitcode` counts
//! it (`trapline_analysis::findings`), so a SARIF viewer and the exit
//! status agree. Its location is the first frame of the program that has a
//! file and a line ([`site_frame`]); the whole stack follows in `stacks`,
//! and a cycle's or deadlock's threads in `codeFlows`.

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::path::Path;

use serde_json::json;
pub use serde_sarif::sarif::Sarif as SarifLog;
use serde_sarif::sarif::{
    Address, ArtifactLocation, CodeFlow, Invocation, Location, LogicalLocation, Message,
    MultiformatMessageString, Notification, PhysicalLocation, PropertyBag, Region,
    ReportingConfiguration, ReportingDescriptor, Result as SarifResult, ResultLevel, Run, Sarif,
    Stack, StackFrame, ThreadFlow, ThreadFlowLocation, Tool, ToolComponent,
};
use trapline_analysis::deadlocks::{CycleReport, EdgeReport};
use trapline_analysis::report::{frame_place, thousands, wrapper_frames, FrameReport};
use trapline_analysis::report::{ProcessReport, TraceStatus};
use trapline_analysis::{DeadlocksReport, LeaksReport};

/// The schema the logs follow (the OASIS standard's, errata 01).
pub const SCHEMA_URI: &str =
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json";

/// The key of each result's `partialFingerprints`: a hash of the rule and
/// of the stack's functions and files, without lines or addresses, so the
/// same finding keeps it across runs and small edits.
pub const FINGERPRINT_KEY: &str = "trapline/stackFunctions/v1";

/// A `leaks` report as a SARIF log.
pub fn leaks(report: &LeaksReport, trace: &Path) -> Sarif {
    let mut log = Log::new(&report.process);
    for record in &report.records {
        let fails = matches!(record.kind, "definitely_lost" | "possibly_lost");
        let level = match record.kind {
            _ if fails => ResultLevel::Error,
            "indirectly_lost" | "unfreed_at_exit" | "live_at_end_of_trace" => ResultLevel::Warning,
            _ => ResultLevel::Note,
        };
        let site = log.site(&record.stack);
        let mut text = format!(
            "{} in {} {} {}, allocated by {}{}.",
            bytes(record.bytes),
            thousands(record.blocks),
            if record.blocks == 1 {
                "block"
            } else {
                "blocks"
            },
            leak_phrase(record.kind, record.blocks),
            record.allocated_by,
            site.as_ref().map_or(String::new(), |s| format!(" in {s}")),
        );
        if let (Some(direct), Some(indirect @ 1..)) = (record.direct_bytes, record.indirect_bytes) {
            text.push_str(&format!(
                " {} direct, {} lost through them.",
                bytes(direct),
                bytes(indirect)
            ));
        }
        let result = log.result(record.kind, level, text, &record.stack, "allocated");
        log.push(
            result,
            json!({"bytes": record.bytes, "blocks": record.blocks,
                   "allocatedBy": record.allocated_by, "verdicts": record.verdicts}),
        );
    }
    for site in &report.growing_sites {
        let text = format!(
            "Live bytes allocated by {}{} kept growing: {}/s for the last {:.1} s.",
            site.allocated_by,
            log.site(&site.stack)
                .map_or(String::new(), |s| format!(" in {s}")),
            bytes(site.growth.bytes_per_second.max(0.0) as u64),
            site.growth.growing_for_seconds,
        );
        let result = log.result(
            "growing_site",
            ResultLevel::Warning,
            text,
            &site.stack,
            "allocated",
        );
        log.push(result, json!({"growth": site.growth}));
    }
    for site in &report.stale_sites {
        let s = &site.staleness;
        let text = format!(
            "{} of {} watched blocks allocated by {}{} went untouched for {:.1} s.",
            thousands(s.untouched_blocks),
            thousands(s.watched_blocks),
            site.allocated_by,
            log.site(&site.stack)
                .map_or(String::new(), |s| format!(" in {s}")),
            s.untouched_seconds,
        );
        let result = log.result(
            "stale_site",
            ResultLevel::Note,
            text,
            &site.stack,
            "allocated",
        );
        log.push(result, json!({"staleness": s}));
    }
    for error in &report.errors {
        let mut text = format!(
            "{} of {:#x} by {}{}",
            error.kind.replace('_', " "),
            error.address,
            error.function,
            log.site(&error.stack)
                .map_or(String::new(), |s| format!(" in {s}")),
        );
        if error.count > 1 {
            text.push_str(&format!(", {} times", thousands(error.count)));
        }
        text.push('.');
        if let (Some(f), Some(size)) = (error.alloc_function, error.alloc_size) {
            text.push_str(&format!(
                " The block ({}) was allocated by {f}.",
                bytes(size)
            ));
        }
        let mut result = log.result(error.kind, ResultLevel::Error, text, &error.stack, "called");
        result.occurrence_count = Some(error.count as i64);
        let mut related = Vec::new();
        log.related(
            &mut related,
            &error.alloc_stack,
            "where the block was allocated",
        );
        log.related(
            &mut related,
            &error.free_stack,
            "where it was first released",
        );
        log.add_stack(&mut result, &error.alloc_stack, "allocated");
        log.add_stack(&mut result, &error.free_stack, "first released");
        if !related.is_empty() {
            result.related_locations = Some(related);
        }
        log.push(
            result,
            json!({"address": format!("{:#x}", error.address), "function": error.function,
                   "thread": error.thread, "count": error.count}),
        );
    }
    log.finish(trace, &report.trace, &report.warnings)
}

/// How a loss record's kind reads after "N bytes in M blocks".
fn leak_phrase(kind: &str, blocks: u64) -> String {
    let are = if blocks == 1 { "is" } else { "are" };
    match kind {
        "definitely_lost" => format!("{are} definitely lost"),
        "indirectly_lost" => format!("{are} indirectly lost"),
        "possibly_lost" => format!("{are} possibly lost"),
        "still_reachable" => format!("{are} still reachable"),
        "unfreed_at_exit" => format!("{are} unfreed at exit"),
        "live_at_end_of_trace" => format!("{are} live at the end of the trace"),
        other => format!("{are} {}", other.replace('_', " ")),
    }
}

/// A `deadlocks` report as a SARIF log.
pub fn deadlocks(report: &DeadlocksReport, trace: &Path) -> Sarif {
    let mut log = Log::new(&report.process);
    for cycle in &report.cycles {
        log.cycle(cycle);
    }
    for deadlock in &report.actual_deadlocks {
        let Some(first) = deadlock.threads.first() else {
            continue;
        };
        let threads: Vec<String> = deadlock
            .threads
            .iter()
            .map(|w| w.thread.to_string())
            .collect();
        let text = format!(
            "Threads {} wait for each other: thread {} waits {}{}, held by thread {}.",
            threads.join(", "),
            first.thread,
            waited(first.waits_in, first.lock_kind, first.waits_for),
            log.site(&first.requested_stack)
                .map_or(String::new(), |s| format!(" in {s}")),
            first.held_by,
        );
        let mut result = log.result(
            "actual_deadlock",
            ResultLevel::Error,
            text,
            &first.requested_stack,
            "waits",
        );
        // Each thread's flow: where it took what another waits for, then
        // where it waits itself.
        let mut flows = Vec::new();
        for w in &deadlock.threads {
            let mut steps = Vec::new();
            for other in deadlock.threads.iter().filter(|o| o.held_by == w.thread) {
                if !other.held_stack.is_empty() {
                    steps.push(log.step(
                        &other.held_stack,
                        format!("takes {} {:#x}", other.lock_kind, other.waits_for),
                    ));
                }
            }
            steps.push(log.step(
                &w.requested_stack,
                format!(
                    "waits {}, held by thread {}",
                    waited(w.waits_in, w.lock_kind, w.waits_for),
                    w.held_by
                ),
            ));
            flows.push(thread_flow(w.thread, steps));
        }
        result.code_flows = Some(vec![CodeFlow::builder().thread_flows(flows).build()]);
        log.push(
            result,
            json!({"threads": deadlock.threads.iter().map(|w| w.thread).collect::<Vec<_>>()}),
        );
    }
    for error in &report.errors {
        // A thread's end holding a lock has no stack of its own: the
        // place it took the lock names it.
        let (stack, role) = if error.stack.is_empty() {
            (&error.held_stack, error.context)
        } else {
            (&error.stack, "called")
        };
        let mut text = format!(
            "{} ({} {:#x}, thread {}{})",
            error.description.trim_end_matches('.'),
            error.lock_kind,
            error.lock,
            error.thread,
            log.site(stack)
                .map_or(String::new(), |s| format!(", in {s}")),
        );
        if error.count > 1 {
            text.push_str(&format!(", {} times", thousands(error.count)));
        }
        text.push('.');
        let mut result = log.result(error.kind, ResultLevel::Error, text, stack, role);
        result.occurrence_count = Some(error.count as i64);
        if !error.stack.is_empty() && !error.held_stack.is_empty() {
            let mut related = Vec::new();
            log.related(
                &mut related,
                &error.held_stack,
                &format!("where the lock was {}", error.context),
            );
            result.related_locations = Some(related);
            log.add_stack(&mut result, &error.held_stack, error.context);
        }
        log.rule_description(error.kind, error.description);
        log.push(
            result,
            json!({"lock": format!("{:#x}", error.lock), "lockKind": error.lock_kind,
                   "thread": error.thread, "count": error.count}),
        );
    }
    log.finish(trace, &report.trace, &report.warnings)
}

/// "for mutex 0x10" or "in pthread_join".
fn waited(waits_in: &str, kind: &str, lock: u64) -> String {
    if waits_in == "join" {
        "in pthread_join".to_string()
    } else {
        format!("for {kind} {lock:#x}")
    }
}

/// The stack, innermost frame first; None when it is empty.
fn sarif_stack(stack: &[FrameReport]) -> Option<Stack> {
    if stack.is_empty() {
        return None;
    }
    let frames = stack
        .iter()
        .map(|f| {
            let mut frame = StackFrame::builder().location(location(f, None)).build();
            frame.module = f.module.clone();
            frame
        })
        .collect::<Vec<_>>();
    Some(Stack::builder().frames(frames).build())
}

fn thread_flow(thread: u32, locations: Vec<ThreadFlowLocation>) -> ThreadFlow {
    let mut flow = ThreadFlow::builder().locations(locations).build();
    flow.id = Some(thread.to_string());
    flow.message = Some(text_message(format!("thread {thread}")));
    flow
}

/// A SARIF log being built: one run, its rules in order of first use.
struct Log<'a> {
    process: &'a ProcessReport,
    rules: Vec<ReportingDescriptor>,
    results: Vec<SarifResult>,
}

impl<'a> Log<'a> {
    fn new(process: &'a ProcessReport) -> Self {
        Log {
            process,
            rules: Vec::new(),
            results: Vec::new(),
        }
    }

    /// `function (file:line)` of the stack's site, if any frame names one.
    fn site(&self, stack: &[FrameReport]) -> Option<String> {
        site_frame(stack, self.process.executable.as_deref()).map(frame_place)
    }

    /// A result of `rule` located at the site of `stack`, with the stack
    /// attached (`role`: what the stack's innermost frame did).
    fn result(
        &mut self,
        rule: &'static str,
        level: ResultLevel,
        text: String,
        stack: &[FrameReport],
        role: &str,
    ) -> SarifResult {
        let index = self.rule_index(rule, &level);
        let mut result = SarifResult::builder()
            .message(text_message(text))
            .rule_id(rule)
            .rule_index(index as i64)
            .level(level)
            .build();
        if let Some(frame) = site_frame(stack, self.process.executable.as_deref()) {
            result.locations = Some(vec![location(frame, None)]);
        }
        let mut fingerprints = BTreeMap::new();
        fingerprints.insert(FINGERPRINT_KEY.to_string(), fingerprint(rule, stack));
        result.partial_fingerprints = Some(fingerprints);
        self.add_stack(&mut result, stack, role);
        result
    }

    /// Adds the stack, innermost frame first, unless it is empty.
    fn add_stack(&self, result: &mut SarifResult, stack: &[FrameReport], role: &str) {
        if let Some(mut s) = sarif_stack(stack) {
            s.message = Some(text_message(role.to_string()));
            result.stacks.get_or_insert_with(Vec::new).push(s);
        }
    }

    /// Adds the site of `stack` to `related`, with an id numbering it.
    fn related(&self, related: &mut Vec<Location>, stack: &[FrameReport], what: &str) {
        if let Some(frame) = site_frame(stack, self.process.executable.as_deref()) {
            let mut l = location(frame, Some(what.to_string()));
            l.id = Some(related.len() as i64);
            related.push(l);
        }
    }

    /// One step of a thread flow at the site of `stack`, with the stack.
    fn step(&self, stack: &[FrameReport], what: String) -> ThreadFlowLocation {
        let site = site_frame(stack, self.process.executable.as_deref());
        let location = match site {
            Some(frame) => location(frame, Some(what)),
            None => Location {
                message: Some(text_message(what)),
                ..Location::default()
            },
        };
        ThreadFlowLocation {
            location: Some(location),
            stack: sarif_stack(stack),
            ..ThreadFlowLocation::default()
        }
    }

    /// A lock-order cycle: located at the first edge's request, each
    /// edge's thread a flow from the lock it held to the one it asked for.
    fn cycle(&mut self, cycle: &CycleReport) {
        let potential = cycle.kind == "potential_deadlock";
        let level = if potential {
            ResultLevel::Error
        } else {
            ResultLevel::Warning
        };
        let locks: Vec<String> = cycle
            .edges
            .iter()
            .map(|e| format!("{} {:#x}", e.held_kind, e.held))
            .collect();
        let first = cycle.edges.first();
        let text = format!(
            "{} of {}: {}{}. Seen {} {}.",
            if potential {
                "Potential deadlock"
            } else {
                "Lock-order inversion of one thread"
            },
            locks.len(),
            locks.join(" → "),
            first
                .and_then(|e| self.site(&e.requested_stack))
                .map_or(String::new(), |s| format!(", requested in {s}")),
            thousands(cycle.occurrences),
            if cycle.occurrences == 1 {
                "time"
            } else {
                "times"
            },
        );
        let stack = first.map_or(&[][..], |e| &e.requested_stack[..]);
        let mut result = self.result(cycle.kind, level, text, stack, "requested");
        result.occurrence_count = Some(cycle.occurrences as i64);
        let flows: Vec<ThreadFlow> = cycle.edges.iter().map(|e| self.edge_flow(e)).collect();
        if !flows.is_empty() {
            result.code_flows = Some(vec![CodeFlow::builder().thread_flows(flows).build()]);
        }
        let mut related = Vec::new();
        for e in &cycle.edges {
            self.related(
                &mut related,
                &e.held_stack,
                &format!("thread {} takes {} {:#x}", e.thread, e.held_kind, e.held),
            );
            self.related(
                &mut related,
                &e.requested_stack,
                &format!(
                    "thread {} then requests {} {:#x}",
                    e.thread, e.requested_kind, e.requested
                ),
            );
        }
        if !related.is_empty() {
            result.related_locations = Some(related);
        }
        self.push(
            result,
            json!({"locks": cycle.locks.iter().map(|l| format!("{l:#x}")).collect::<Vec<_>>(),
                   "group": cycle.group}),
        );
    }

    fn edge_flow(&self, e: &EdgeReport) -> ThreadFlow {
        let held = if e.held_kind == "thread" {
            "runs (created here)".to_string()
        } else {
            format!("takes {} {:#x} ({})", e.held_kind, e.held, e.held_mode)
        };
        let requested = if e.requested_kind == "thread" {
            format!("joins thread {}", e.joined)
        } else {
            format!(
                "requests {} {:#x} ({}) while holding it",
                e.requested_kind, e.requested, e.requested_mode
            )
        };
        thread_flow(
            e.thread,
            vec![
                self.step(&e.held_stack, held),
                self.step(&e.requested_stack, requested),
            ],
        )
    }

    /// The index of `rule` in the run's rules, added on first use.
    fn rule_index(&mut self, rule: &str, level: &ResultLevel) -> usize {
        if let Some(i) = self.rules.iter().position(|r| r.id == rule) {
            return i;
        }
        let mut descriptor = ReportingDescriptor::builder().id(rule).build();
        descriptor.name = Some(rule_name(rule));
        descriptor.short_description = rule_summary(rule).map(multiformat);
        descriptor.default_configuration = Some(ReportingConfiguration {
            level: Some(json!(level_name(level))),
            ..ReportingConfiguration::default()
        });
        self.rules.push(descriptor);
        self.rules.len() - 1
    }

    /// Gives `rule` the report's own description when it has none.
    fn rule_description(&mut self, rule: &str, description: &str) {
        if let Some(r) = self.rules.iter_mut().find(|r| r.id == rule) {
            r.short_description
                .get_or_insert_with(|| multiformat(description.to_string()));
        }
    }

    fn push(&mut self, mut result: SarifResult, properties: serde_json::Value) {
        if let serde_json::Value::Object(map) = properties {
            result.properties = Some(PropertyBag {
                tags: None,
                additional_properties: map.into_iter().collect(),
            });
        }
        self.results.push(result);
    }

    /// The log: the run's tool, invocation (the traced process and how
    /// reading the trace went) and results.
    fn finish(self, trace: &Path, status: &TraceStatus, warnings: &[String]) -> Sarif {
        let mut driver = ToolComponent::builder().name("trapline").build();
        driver.version = Some(env!("CARGO_PKG_VERSION").to_string());
        driver.rules = Some(self.rules);
        let mut notes: Vec<Notification> = warnings
            .iter()
            .map(|w| notification(w.clone(), "warning"))
            .collect();
        if let Some(stopped) = &status.stopped {
            notes.push(notification(
                format!("reading the trace stopped early: {}", stopped.reason),
                "warning",
            ));
        }
        for damaged in &status.damaged_chunks {
            notes.push(notification(
                format!("a damaged chunk was skipped: {}", damaged.reason),
                "warning",
            ));
        }
        let mut invocation = Invocation::builder().execution_successful(true).build();
        if !notes.is_empty() {
            invocation.tool_execution_notifications = Some(notes);
        }
        let mut properties = BTreeMap::new();
        properties.insert("trace".to_string(), json!(trace.display().to_string()));
        properties.insert("traceComplete".to_string(), json!(status.complete));
        properties.insert("process".to_string(), json!(self.process));
        invocation.properties = Some(PropertyBag {
            tags: None,
            additional_properties: properties,
        });
        let mut run = Run::builder()
            .tool(Tool::builder().driver(driver).build())
            .results(self.results)
            .build();
        run.invocations = Some(vec![invocation]);
        let mut log = Sarif::builder()
            .version(json!("2.1.0"))
            .runs(vec![run])
            .build();
        log.schema = Some(SCHEMA_URI.to_string());
        log
    }
}

fn notification(text: String, level: &str) -> Notification {
    let mut n = Notification::builder().message(text_message(text)).build();
    n.level = Some(json!(level));
    n
}

fn level_name(level: &ResultLevel) -> &'static str {
    match level {
        ResultLevel::None => "none",
        ResultLevel::Note => "note",
        ResultLevel::Warning => "warning",
        ResultLevel::Error => "error",
    }
}

/// `definitely_lost` → `DefinitelyLost`, SARIF's convention for rule names.
fn rule_name(rule: &str) -> String {
    rule.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map_or(String::new(), |f| f.to_uppercase().chain(c).collect())
        })
        .collect()
}

/// One sentence per rule trapline defines here; lock misuse kinds take the
/// report's own sentence ([`Log::rule_description`]).
fn rule_summary(rule: &str) -> Option<String> {
    let s = match rule {
        "definitely_lost" => "A block no pointer in the roots or the heap reaches.",
        "indirectly_lost" => "A block reached only from definitely lost blocks.",
        "possibly_lost" => "A block reached only by pointers into its interior.",
        "still_reachable" => "A block a root still points to at exit.",
        "unfreed_at_exit" => "A block still allocated when the process exited (no scan).",
        "live_at_end_of_trace" => "A block still allocated when the trace ended.",
        "growing_site" => "An allocation site whose live bytes kept growing.",
        "stale_site" => "An allocation site whose watched blocks went untouched.",
        "double_free" => "A block released twice.",
        "invalid_free" => "A release of an address the allocator never returned.",
        "mismatched_free" => "A block released by a function of another allocator family.",
        "invalid_realloc" => "realloc of an address the allocator never returned.",
        "mismatched_size" => "A sized delete given another size than the block's.",
        "mismatched_alignment" => "An aligned delete given another alignment than the block's.",
        "potential_deadlock" => "Threads take locks in orders that form a cycle.",
        "lock_order_inversion" => "One thread takes locks in orders that form a cycle.",
        "actual_deadlock" => "Threads waited for each other when the trace ended.",
        _ => return None,
    };
    Some(s.to_string())
}

fn multiformat(text: String) -> MultiformatMessageString {
    MultiformatMessageString::builder().text(text).build()
}

fn text_message(text: String) -> Message {
    Message {
        text: Some(text),
        ..Message::default()
    }
}

/// The frame that names a finding's place, past the allocation wrappers:
/// the first with a file and a line in the program's executable, else in
/// one of its own libraries (outside the system's directories); else the
/// program's first frame without a line (a build without debug
/// information: its function and address); else the first frame with a
/// file and a line anywhere; else the first frame. None for an empty stack.
pub fn site_frame<'f>(
    stack: &'f [FrameReport],
    executable: Option<&str>,
) -> Option<&'f FrameReport> {
    let frames = &stack[wrapper_frames(stack)..];
    let system = |m: &str| {
        [
            "/lib/",
            "/lib64/",
            "/usr/lib/",
            "/usr/lib64/",
            "/usr/libexec/",
        ]
        .iter()
        .any(|d| m.starts_with(d))
    };
    let in_executable =
        |f: &&FrameReport| executable.is_some() && f.module.as_deref() == executable;
    let in_program = |f: &&FrameReport| f.module.as_deref().is_some_and(|m| !system(m));
    let located = |f: &&FrameReport| f.file.is_some() && f.line.is_some();
    let first = |keep: &dyn Fn(&&FrameReport) -> bool| frames.iter().find(|f| keep(f));
    first(&|f| located(f) && in_executable(f))
        .or_else(|| first(&|f| located(f) && in_program(f)))
        .or_else(|| first(&in_program))
        .or_else(|| first(&located))
        .or_else(|| frames.first())
}

/// A frame as a SARIF location: its file and line when known, its
/// function, and its address in its module.
fn location(f: &FrameReport, message: Option<String>) -> Location {
    let mut physical = PhysicalLocation {
        address: Some(Address {
            absolute_address: i64::try_from(f.address).ok(),
            fully_qualified_name: f.module.clone(),
            ..Address::default()
        }),
        ..PhysicalLocation::default()
    };
    if let Some(file) = &f.file {
        physical.artifact_location = Some(ArtifactLocation {
            uri: Some(file_uri(file)),
            ..ArtifactLocation::default()
        });
        physical.region = f.line.filter(|&l| l > 0).map(|l| Region {
            start_line: Some(i64::from(l)),
            ..Region::default()
        });
    }
    Location {
        physical_location: Some(physical),
        logical_locations: f.function.as_ref().map(|name| {
            vec![LogicalLocation {
                fully_qualified_name: Some(name.clone()),
                kind: Some("function".to_string()),
                ..LogicalLocation::default()
            }]
        }),
        message: message.map(text_message),
        ..Location::default()
    }
}

/// A source path as a URI reference: `file:///abs/path` for an absolute
/// path; a relative one (as the debug information gave it, relative to
/// the compilation's directory) percent-encoded and left relative.
fn file_uri(path: &str) -> String {
    if path.starts_with('/') {
        if let Ok(url) = url::Url::from_file_path(path) {
            return url.to_string();
        }
    }
    percent_encoding::utf8_percent_encode(path, RELATIVE_PATH).to_string()
}

/// What a relative path's bytes must escape: all but RFC 3986's
/// unreserved characters and `/`.
const RELATIVE_PATH: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'/')
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The result's fingerprint: XXH64 of the rule and each frame's function
/// and file name (no directories, lines or addresses), as 16 hex digits.
fn fingerprint(rule: &str, stack: &[FrameReport]) -> String {
    let mut h = twox_hash::XxHash64::with_seed(0);
    h.write(rule.as_bytes());
    for f in stack {
        h.write_u8(0);
        h.write(f.function.as_deref().unwrap_or("?").as_bytes());
        h.write_u8(1);
        let file = f.file.as_deref().map(|p| p.rsplit('/').next().unwrap_or(p));
        h.write(file.unwrap_or("?").as_bytes());
    }
    format!("{:016x}", h.finish())
}

/// "100 bytes", "1 byte".
fn bytes(n: u64) -> String {
    format!("{} {}", thousands(n), if n == 1 { "byte" } else { "bytes" })
}
