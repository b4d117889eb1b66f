//! One self-contained HTML page of a traced process tree (`trapline
//! report`): no network, no external file, readable from disk.
//!
//! Each process gets a tab: its totals; the heap over time (total live
//! bytes and the sites with the most bytes at the peak as stacked areas,
//! scans and watchers' verdicts marked on the time axis), drawn as SVG
//! here; the loss records with expandable stacks; the allocation errors;
//! flame graphs of the bytes allocated, of the bytes live at the end and,
//! when profiled, of the CPU, drawn by inferno and embedded as images (their
//! own scripts do not run there, so several graphs cannot clash); the lock
//! table; the lock-order cycles and the deadlocks of a hung run, drawn as graphs.
//! The page's only script switches tabs.

use std::fmt::Write as _;
use std::io::Write;

use base64::Engine as _;
use trapline_analysis::deadlocks::DeadlocksReport;
use trapline_analysis::heap_profile::HeapProfile;
use trapline_analysis::leaks::LeaksReport;
use trapline_analysis::locks::LocksReport;
use trapline_analysis::profile::ProfileReport;
use trapline_analysis::report::{frame_place, stack_place, thousands, FrameReport};
use trapline_analysis::stats::StatsReport;
use trapline_analysis::timeline::Timeline;

/// What one process's tab shows.
pub struct ProcessPage {
    pub leaks: LeaksReport,
    pub stats: StatsReport,
    pub heap: HeapProfile,
    /// The heap over time; its site series are those of `timeline_sites`.
    pub timeline: Timeline,
    /// The followed sites' names, in the timeline's order.
    pub timeline_sites: Vec<String>,
    /// None when the trace has no CPU samples.
    pub profile: Option<ProfileReport>,
    pub locks: Option<LocksReport>,
    pub deadlocks: Option<DeadlocksReport>,
}

/// Colours of the stacked site areas (the rest of the heap is grey).
const SITE_COLOURS: [&str; 5] = ["#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e"];

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A stack's name in one line (`report::stack_place`).
pub fn stack_name(stack: &[FrameReport]) -> String {
    stack_place(stack, " \u{2190} ").unwrap_or_else(|| "(no stack)".to_string())
}

fn stack_list(out: &mut String, stack: &[FrameReport]) {
    out.push_str("<ol class=\"stack\">");
    for f in stack {
        let inl = if f.inlined { " <i>(inlined)</i>" } else { "" };
        let _ = write!(out, "<li>{}{inl}</li>", esc(&frame_place(f)));
    }
    out.push_str("</ol>");
}

/// Writes the page.
pub fn write(pages: &[ProcessPage], out: &mut impl Write) -> std::io::Result<()> {
    let mut h = String::new();
    h.push_str(HEAD);
    h.push_str("<nav>");
    for (i, p) in pages.iter().enumerate() {
        let proc = &p.stats.process;
        let exe = proc.executable.as_deref().unwrap_or("?");
        let name = exe.rsplit('/').next().unwrap_or(exe);
        let _ = write!(
            h,
            "<button class=\"tab{}\" data-tab=\"{i}\">{} <small>pid {}</small></button>",
            if i == 0 { " active" } else { "" },
            esc(name),
            proc.pid.map_or("?".to_string(), |p| p.to_string())
        );
    }
    h.push_str("</nav>");
    for (i, p) in pages.iter().enumerate() {
        let _ = write!(
            h,
            "<section class=\"process\" id=\"process-{i}\"{}>",
            if i == 0 { "" } else { " hidden" }
        );
        process(&mut h, p);
        h.push_str("</section>");
    }
    h.push_str(TAIL);
    out.write_all(h.as_bytes())
}

fn process(h: &mut String, p: &ProcessPage) {
    let s = &p.stats;
    let l = &p.leaks;
    let _ = write!(
        h,
        "<h1>{}</h1><p class=\"command\">{}</p>",
        esc(&format!(
            "trapline report: pid {}",
            s.process.pid.map_or("?".into(), |p| p.to_string())
        )),
        esc(&trapline_analysis::report::command_text(&s.process))
    );
    // memcheck's LEAK SUMMARY: definitely lost is the leaders' own bytes,
    // indirectly lost those lost through them; the table's records give
    // both, as memcheck's loss records do.
    let definitely = l.summary.definitely_lost.map(|b| b.bytes);
    let indirectly = l.summary.indirectly_lost.map(|b| b.bytes);
    let possibly = l.summary.possibly_lost.map(|b| b.bytes);
    let findings = trapline_analysis::findings::Findings::of(l, p.deadlocks.as_ref());
    let detached = l.process.exit.is_some_and(|e| e.detached);
    let cards = [
        (
            if detached {
                "in use at detach"
            } else {
                "in use at exit"
            },
            format!("{} bytes", thousands(l.summary.unfreed_at_exit.bytes)),
            "unfreed",
        ),
        (
            "definitely lost",
            definitely.map_or("not judged".into(), |b| format!("{} bytes", thousands(b))),
            "definitely-lost",
        ),
        (
            "indirectly lost",
            indirectly.map_or("not judged".into(), |b| format!("{} bytes", thousands(b))),
            "indirectly-lost",
        ),
        (
            "possibly lost",
            possibly.map_or("not judged".into(), |b| format!("{} bytes", thousands(b))),
            "possibly-lost",
        ),
        // Counted as `trapline run`'s summary counts them.
        (
            "errors found",
            match findings.error_kinds_text() {
                Some(kinds) => format!("{} ({kinds})", thousands(findings.errors())),
                None => thousands(findings.errors()),
            },
            "errors",
        ),
        (
            "peak heap",
            format!("{} bytes", thousands(s.peak_heap.bytes)),
            "peak",
        ),
        ("allocation calls", thousands(s.allocation_calls), "calls"),
    ];
    h.push_str("<div class=\"cards\">");
    for (label, value, id) in cards {
        let _ = write!(
            h,
            "<div class=\"card\" id=\"{id}\"><div class=\"value\">{}</div><div>{label}</div></div>",
            esc(&value)
        );
    }
    h.push_str("</div>");
    // What the text reports print last: how the trace was made or read.
    let notes: Vec<String> = trapline_analysis::report::status_warnings(&l.trace)
        .into_iter()
        .chain(l.warnings.iter().cloned())
        .collect();
    if !notes.is_empty() {
        h.push_str("<ul class=\"warnings\">");
        for n in &notes {
            let _ = write!(h, "<li>{}</li>", esc(n));
        }
        h.push_str("</ul>");
    }
    if let Some(sampling) = &l.sampling {
        let note = sampling.export_note();
        let mut chars = note.chars();
        let capitalized: String = chars
            .next()
            .map(|c| c.to_ascii_uppercase())
            .into_iter()
            .chain(chars)
            .collect();
        let _ = write!(h, "<p class=\"note\">{}.</p>", esc(&capitalized));
    }

    h.push_str("<h2>Heap over time</h2>");
    heap_plot(h, &p.timeline, &p.timeline_sites, p.heap.live_at_seconds);

    leak_table(h, l);
    errors(h, l);

    h.push_str("<h2>Allocation flame graphs</h2>");
    let folded = |value: fn(&trapline_analysis::heap_profile::HeapSite) -> u64| {
        p.heap
            .sites
            .iter()
            .filter(|s| value(s) > 0)
            .map(|s| (folded_line(&s.frames), value(s)))
            .collect::<Vec<_>>()
    };
    flame(
        h,
        "Bytes allocated",
        "bytes",
        &folded(|s| s.allocated_bytes),
    );
    flame(
        h,
        "Bytes live at the end",
        "bytes",
        &folded(|s| s.live_bytes),
    );
    if let Some(at) = p.heap.live_at_seconds {
        flame(
            h,
            &format!("Bytes live at {at} s"),
            "bytes",
            &folded(|s| s.live_at_bytes),
        );
    }
    if let Some(prof) = &p.profile {
        h.push_str("<h2>CPU</h2>");
        let lines: Vec<(String, u64)> = prof.folded.clone();
        flame(h, "CPU samples", "samples", &lines);
    }
    if let Some(locks) = &p.locks {
        lock_table(h, locks);
    }
    if let Some(d) = &p.deadlocks {
        cycles(h, d);
    }
}

/// A stack as a flame graph's folded line: root first, `;`-separated.
fn folded_line(frames: &[FrameReport]) -> String {
    let names: Vec<String> = frames
        .iter()
        .rev()
        .map(|f| {
            f.function
                .clone()
                .unwrap_or_else(|| format!("{:#x}", f.address))
                .replace(';', ":")
        })
        .collect();
    if names.is_empty() {
        "(no stack)".into()
    } else {
        names.join(";")
    }
}

fn flame(h: &mut String, title: &str, unit: &str, lines: &[(String, u64)]) {
    let _ = write!(h, "<h3>{}</h3>", esc(title));
    if lines.is_empty() {
        h.push_str("<p class=\"note\">Nothing to draw.</p>");
        return;
    }
    let text: String = lines.iter().map(|(l, n)| format!("{l} {n}\n")).collect();
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = unit.to_string();
    let mut svg = Vec::new();
    match inferno::flamegraph::from_lines(&mut options, text.lines(), &mut svg) {
        Ok(()) => {
            let data = base64::engine::general_purpose::STANDARD.encode(&svg);
            let _ = write!(
                h,
                "<img class=\"flame\" alt=\"{}\" src=\"data:image/svg+xml;base64,{data}\">",
                esc(title)
            );
        }
        Err(e) => {
            let _ = write!(
                h,
                "<p class=\"note\">Cannot draw: {}</p>",
                esc(&e.to_string())
            );
        }
    }
}

/// Total live bytes as a line, the followed sites as stacked areas under
/// it, scans and verdicts as marks on the time axis, and the time chosen
/// for a flame graph (`report --at`) as a line.
fn heap_plot(h: &mut String, t: &Timeline, names: &[String], chosen: Option<f64>) {
    let (w, ht, left, bottom) = (900.0, 280.0, 110.0, 30.0);
    let max = t.live_bytes.iter().copied().max().unwrap_or(0).max(1) as f64;
    let end = t.seconds.last().copied().unwrap_or(0.0).max(1e-9);
    let x = |s: f64| left + (w - left - 10.0) * s / end;
    let y = |b: f64| (ht - bottom) - (ht - bottom - 10.0) * b / max;
    let _ = write!(
        h,
        "<svg class=\"heap\" viewBox=\"0 0 {w} {ht}\" width=\"{w}\" height=\"{ht}\" role=\"img\">"
    );
    // Stacked areas, bottom up.
    let mut base = vec![0f64; t.seconds.len()];
    for (k, series) in t.sites.iter().enumerate() {
        let top: Vec<f64> = base
            .iter()
            .zip(series)
            .map(|(b, &v)| b + v as f64)
            .collect();
        let mut pts = String::new();
        for (i, &s) in t.seconds.iter().enumerate() {
            let _ = write!(pts, "{:.1},{:.1} ", x(s), y(top[i]));
        }
        for (i, &s) in t.seconds.iter().enumerate().rev() {
            let _ = write!(pts, "{:.1},{:.1} ", x(s), y(base[i]));
        }
        let name = names.get(k).map_or("", String::as_str);
        let _ = write!(
            h,
            "<polygon class=\"site\" points=\"{}\" fill=\"{}\" fill-opacity=\"0.55\"><title>{}</title></polygon>",
            pts.trim_end(),
            SITE_COLOURS[k % SITE_COLOURS.len()],
            esc(name)
        );
        base = top;
    }
    let mut pts = String::new();
    for (i, &s) in t.seconds.iter().enumerate() {
        let _ = write!(pts, "{:.1},{:.1} ", x(s), y(t.live_bytes[i] as f64));
    }
    let _ = write!(
        h,
        "<polyline class=\"total\" points=\"{}\" fill=\"none\" stroke=\"#333\" stroke-width=\"1.5\"><title>live bytes</title></polyline>",
        pts.trim_end()
    );
    for (s, trigger) in &t.scans {
        let _ = write!(
            h,
            "<line class=\"scan\" x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"10\" y2=\"{1}\" stroke=\"#2b8cbe\" stroke-dasharray=\"4 3\"><title>{2} scan at {3:.3} s</title></line>",
            x(*s),
            ht - bottom,
            trigger,
            s
        );
    }
    if let Some(s) = chosen {
        let _ = write!(
            h,
            "<line class=\"chosen\" x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"10\" y2=\"{1}\" stroke=\"#f16913\" stroke-width=\"2\"><title>bytes live at {s} s: flame graph below</title></line>",
            x(s - t.start_ns as f64 / 1e9),
            ht - bottom,
        );
    }
    for (s, stack, kinds) in &t.verdicts {
        let _ = write!(
            h,
            "<circle class=\"verdict\" cx=\"{:.1}\" cy=\"{}\" r=\"4\" fill=\"#e31a1c\"><title>stack {stack}: {} at {s:.3} s</title></circle>",
            x(*s),
            ht - bottom,
            esc(kinds)
        );
    }
    // Axes.
    let _ = write!(
        h,
        "<line x1=\"{left}\" x2=\"{left}\" y1=\"10\" y2=\"{0}\" stroke=\"#000\"/><line x1=\"{left}\" x2=\"{1}\" y1=\"{0}\" y2=\"{0}\" stroke=\"#000\"/>",
        ht - bottom,
        w - 10.0
    );
    let _ = write!(
        h,
        "<text x=\"{0}\" y=\"18\" text-anchor=\"end\" font-size=\"11\">{1}</text><text x=\"{0}\" y=\"{2}\" text-anchor=\"end\" font-size=\"11\">0</text><text x=\"{3}\" y=\"{4}\" text-anchor=\"end\" font-size=\"11\">{5:.3} s</text>",
        left - 4.0,
        esc(&format!("{} B", thousands(max as u64))),
        ht - bottom,
        w - 10.0,
        ht - 8.0,
        end
    );
    h.push_str(
        "</svg><ul class=\"legend\"><li><span style=\"background:#333\"></span>live bytes</li>",
    );
    for (k, name) in names.iter().enumerate() {
        let _ = write!(
            h,
            "<li><span style=\"background:{}\"></span>{}</li>",
            SITE_COLOURS[k % SITE_COLOURS.len()],
            esc(name)
        );
    }
    h.push_str("</ul>");
}

/// Locks listed in the page's table, the most contended first.
const LOCKS_LISTED: usize = 30;

/// Opens a table whose columns sort on a click of their heading (the
/// page's script: numbers by their `data-sort`, text as written), sorted
/// descending by column `sorted` as the analysis ranked it. `name` names
/// the table in the page's `#sort=NAME:COLUMN:ORDER` address.
fn sortable_head(h: &mut String, name: &str, columns: &[&str], sorted: usize) {
    let _ = write!(
        h,
        "<table class=\"{name} sortable\" data-table=\"{name}\"><thead><tr>"
    );
    for (i, c) in columns.iter().enumerate() {
        let order = if i == sorted {
            " aria-sort=\"descending\""
        } else {
            ""
        };
        let _ = write!(h, "<th{order}><button type=\"button\">{c}</button></th>");
    }
    h.push_str("</tr></thead><tbody>");
}

fn leak_table(h: &mut String, l: &LeaksReport) {
    h.push_str("<h2>Leaks</h2>");
    if l.records.is_empty() {
        h.push_str("<p class=\"note\">No loss record of the kinds listed.</p>");
        return;
    }
    sortable_head(
        h,
        "leaks",
        &[
            "kind",
            "bytes",
            "blocks",
            "function",
            "allocated at",
            "verdicts",
        ],
        1,
    );
    for r in &l.records {
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"num\" data-sort=\"{}\">{}</td><td class=\"num\" data-sort=\"{}\">{}</td><td>{}</td><td><details><summary>{}</summary>",
            r.kind.replace('_', " "),
            r.bytes,
            trapline_analysis::leaks::record_amount(r),
            r.blocks,
            thousands(r.blocks),
            esc(r.allocated_by),
            esc(&stack_name(&r.stack))
        );
        stack_list(h, &r.stack);
        let _ = write!(h, "</details></td><td>{}</td></tr>", r.verdicts.join(", "));
    }
    h.push_str("</tbody></table>");
}

fn errors(h: &mut String, l: &LeaksReport) {
    if l.errors.is_empty() {
        return;
    }
    h.push_str("<h2>Allocation errors</h2>");
    sortable_head(h, "errors", &["error", "count", "function", "at"], 1);
    for e in &l.errors {
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"num\" data-sort=\"{}\">{}</td><td>{}</td><td><details><summary>{}</summary>",
            e.kind.replace('_', " "),
            e.count,
            thousands(e.count),
            esc(e.function),
            esc(&stack_name(&e.stack))
        );
        stack_list(h, &e.stack);
        if !e.alloc_stack.is_empty() {
            h.push_str("<p>allocated at</p>");
            stack_list(h, &e.alloc_stack);
        }
        h.push_str("</details></td></tr>");
    }
    h.push_str("</tbody></table>");
}

fn lock_table(h: &mut String, l: &LocksReport) {
    if l.locks.is_empty() {
        return;
    }
    h.push_str("<h2>Locks</h2>");
    if l.locks.len() > LOCKS_LISTED {
        let _ = write!(
            h,
            "<p class=\"note\">The {LOCKS_LISTED} most contended of {} locks and modes (<code>trapline locks --top 0</code> lists all).</p>",
            thousands(l.locks.len() as u64)
        );
    }
    sortable_head(
        h,
        "locks",
        &[
            "lock",
            "acquisitions",
            "contended",
            "wait total",
            "hold avg",
            "first used at",
        ],
        2,
    );
    for k in l.locks.iter().take(LOCKS_LISTED) {
        // A hold no tick fell into is not resolved (locks.rs).
        let hold = if k.hold_ns.max < trapline_analysis::locks::HOLD_RESOLUTION_NS {
            "&lt; 1 ms".to_string()
        } else {
            format!("{} ns", thousands(k.hold_ns.avg))
        };
        let _ = write!(
            h,
            "<tr><td>{} {:#x}</td><td class=\"num\" data-sort=\"{}\">{}</td><td class=\"num\" data-sort=\"{}\">{}</td><td class=\"num\" data-sort=\"{}\">{} ns</td><td class=\"num\" data-sort=\"{}\">{hold}</td><td><details><summary>{}</summary>",
            k.kind,
            k.address,
            k.acquisitions,
            thousands(k.acquisitions),
            k.contended,
            thousands(k.contended),
            k.wait_ns.total,
            thousands(k.wait_ns.total),
            k.hold_ns.avg,
            esc(&stack_name(&k.first_use_stack))
        );
        stack_list(h, &k.first_use_stack);
        h.push_str("</details></td></tr>");
    }
    h.push_str("</tbody></table>");
}

/// The lock-order cycles (locks in a ring, an arrow per edge from the lock
/// held to the lock asked for) and the real deadlocks of a hung run
/// (threads in a ring, an arrow from each waiting thread to the thread
/// that holds what it waits for).
fn cycles(h: &mut String, d: &DeadlocksReport) {
    if !d.actual_deadlocks.is_empty() {
        h.push_str("<h2>Deadlocks</h2>");
    }
    for dl in &d.actual_deadlocks {
        let nodes: Vec<(u64, String)> = dl
            .threads
            .iter()
            .map(|w| (u64::from(w.thread), format!("T{}", w.thread)))
            .collect();
        let edges: Vec<Edge> = dl
            .threads
            .iter()
            .map(|w| Edge {
                from: u64::from(w.thread),
                to: u64::from(w.held_by),
                label: format!("{:#x}", w.waits_for & 0xffff),
                title: format!(
                    "thread {} waits in {} for {:#x}, held by thread {}",
                    w.thread, w.waits_in, w.waits_for, w.held_by
                ),
            })
            .collect();
        ring(
            h,
            "deadlock",
            &nodes,
            &edges,
            &format!("deadlock of {} threads at the end of the run", nodes.len()),
        );
        h.push_str(
            "<table class=\"deadlock\"><tr><th>thread</th><th>waits for</th><th>held by</th><th>asked at</th><th>taken at</th></tr>",
        );
        for w in &dl.threads {
            let _ = write!(
                h,
                "<tr><td class=\"num\">{}</td><td>{} {:#x} ({})</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
                w.thread,
                esc(w.lock_kind),
                w.waits_for,
                esc(w.waits_in),
                w.held_by,
                esc(&stack_name(&w.requested_stack)),
                esc(&stack_name(&w.held_stack)),
            );
        }
        h.push_str("</table>");
    }
    if d.cycles.is_empty() {
        return;
    }
    h.push_str("<h2>Lock-order cycles</h2>");
    // A thread (a step through pthread_join) has address 0: it is named by
    // its tid, above every address.
    let thread_id = |tid: u32| (1 << 63) | u64::from(tid);
    for c in &d.cycles {
        let nodes: Vec<(u64, String)> = c
            .edges
            .iter()
            .map(|e| match e.held_kind {
                "thread" => (thread_id(e.thread), format!("T{}", e.thread)),
                _ => (e.held, format!("{:#x}", e.held & 0xffff)),
            })
            .collect();
        let edges: Vec<Edge> = c
            .edges
            .iter()
            .map(|e| {
                let (from, holds) = match e.held_kind {
                    "thread" => (thread_id(e.thread), "runs".to_owned()),
                    _ => (e.held, format!("holds {:#x}", e.held)),
                };
                let (to, asks) = match e.requested_kind {
                    "thread" => (thread_id(e.joined), format!("joins thread {}", e.joined)),
                    _ => (e.requested, format!("asks for {:#x}", e.requested)),
                };
                Edge {
                    from,
                    to,
                    label: format!("T{}", e.thread),
                    title: format!("thread {} {holds}, {asks}", e.thread),
                }
            })
            .collect();
        ring(
            h,
            "cycle",
            &nodes,
            &edges,
            &format!(
                "{} cycle of {} locks, seen {} times",
                c.kind.replace('_', " "),
                c.locks.len(),
                c.occurrences
            ),
        );
    }
}

/// An arrow of a ring graph.
struct Edge {
    from: u64,
    to: u64,
    label: String,
    title: String,
}

/// Nodes on a circle, arrows between them, a caption under it.
fn ring(h: &mut String, class: &str, nodes: &[(u64, String)], edges: &[Edge], caption: &str) {
    let n = nodes.len().max(1);
    let (cx, cy, r) = (160.0, 120.0, 80.0);
    let pos = |id: u64| {
        let i = nodes.iter().position(|&(k, _)| k == id).unwrap_or(0);
        let a = std::f64::consts::TAU * i as f64 / n as f64 - std::f64::consts::FRAC_PI_2;
        (cx + r * a.cos(), cy + r * a.sin())
    };
    let _ = write!(
        h,
        "<figure class=\"{class}\"><svg viewBox=\"0 0 320 240\" width=\"320\" height=\"240\"><defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"6\" markerHeight=\"6\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\"/></marker></defs>"
    );
    for e in edges {
        let (x1, y1) = pos(e.from);
        let (x2, y2) = pos(e.to);
        // Stop short of the node's circle.
        let (dx, dy) = (x2 - x1, y2 - y1);
        let len = (dx * dx + dy * dy).sqrt().max(1.0);
        let (ex, ey) = (x2 - dx / len * 22.0, y2 - dy / len * 22.0);
        let _ = write!(
            h,
            "<line class=\"edge\" x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{ex:.1}\" y2=\"{ey:.1}\" stroke=\"#444\" marker-end=\"url(#arrow)\"><title>{}</title></line><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{}</text>",
            esc(&e.title),
            (x1 + x2) / 2.0,
            (y1 + y2) / 2.0 - 4.0,
            esc(&e.label)
        );
    }
    for (id, label) in nodes {
        let (x, y) = pos(*id);
        let _ = write!(
            h,
            "<circle class=\"node\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"20\" fill=\"#fdd\" stroke=\"#900\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"9\">{}</text>",
            y + 3.0,
            esc(label)
        );
    }
    let _ = write!(
        h,
        "</svg><figcaption>{}</figcaption></figure>",
        esc(caption)
    );
}

const HEAD: &str = r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>trapline report</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
nav{background:#263238;padding:6px}
nav button{background:#37474f;color:#eee;border:0;padding:6px 12px;margin-right:4px;cursor:pointer}
nav button.active{background:#eceff1;color:#111}
section{padding:0 18px 24px}
h1{font-size:20px;margin:14px 0 2px}
.command{font-family:monospace;color:#555;margin:0 0 10px;word-break:break-all}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #cfd8dc;border-radius:6px;padding:8px 12px;min-width:150px}
.card .value{font-size:18px;font-weight:600}
table{border-collapse:collapse;margin:6px 0}
th,td{border-bottom:1px solid #e0e0e0;padding:4px 8px;text-align:left;vertical-align:top}
th button{font:inherit;font-weight:600;background:none;border:0;padding:0;cursor:pointer}
th[aria-sort=descending] button::after{content:" \25BC"}
th[aria-sort=ascending] button::after{content:" \25B2"}
td.num{text-align:right;font-variant-numeric:tabular-nums}
ol.stack{font-family:monospace;font-size:12px;margin:4px 0;padding-left:22px}
.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:12px;font-size:12px}
.legend span{display:inline-block;width:10px;height:10px;margin-right:4px}
img.flame{max-width:100%;border:1px solid #eee}
.note{color:#666}
figure.cycle,figure.deadlock{display:inline-block;margin:6px}
</style></head><body>
"#;

const TAIL: &str = r##"<script>
// Sortable tables: a heading's button sorts by its column, descending
// first, then the other way; the address keeps the order (#sort=T:C:O).
function sortTable(table, col, order) {
  const body = table.tBodies[0];
  const key = r => {
    const c = r.cells[col];
    return c.dataset.sort !== undefined ? Number(c.dataset.sort) : c.textContent.trim().toLowerCase();
  };
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    const o = x < y ? -1 : x > y ? 1 : 0;
    return order === "ascending" ? o : -o;
  });
  for (const r of rows) body.appendChild(r);
  Array.from(table.tHead.rows[0].cells).forEach((th, i) => {
    if (i === col) th.setAttribute("aria-sort", order); else th.removeAttribute("aria-sort");
  });
}
for (const table of document.querySelectorAll("table.sortable")) {
  Array.from(table.tHead.rows[0].cells).forEach((th, i) => {
    th.querySelector("button").addEventListener("click", () => {
      const order = th.getAttribute("aria-sort") === "descending" ? "ascending" : "descending";
      sortTable(table, i, order);
      history.replaceState(null, "", "#sort=" + table.dataset.table + ":" + i + ":" + order);
    });
  });
}
const asked = /^#sort=(\w+):(\d+):(ascending|descending)$/.exec(location.hash);
if (asked) {
  for (const t of document.querySelectorAll("table.sortable[data-table=\"" + asked[1] + "\"]")) {
    if (Number(asked[2]) < t.tHead.rows[0].cells.length) sortTable(t, Number(asked[2]), asked[3]);
  }
}
for (const b of document.querySelectorAll("nav button")) {
  b.addEventListener("click", () => {
    for (const o of document.querySelectorAll("nav button")) o.classList.toggle("active", o === b);
    for (const s of document.querySelectorAll("section.process")) s.hidden = s.id !== "process-" + b.dataset.tab;
  });
}
</script>
</body></html>
"##;
