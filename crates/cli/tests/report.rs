//! `trapline report`: the HTML page, loaded in a real headless Chromium
//! (Debian's chromium, which .ci/run installs): its DOM after the page's
//! script ran holds the run's numbers and names, its plot has its points,
//! it renders to a screenshot, and it logs nothing to the console.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// Chromium, headless, on a fresh profile in `dir`, with `args`, on `page`:
/// (stdout, stderr).
fn chromium(dir: &Path, args: &[&str], page: &Path) -> (String, String) {
    chromium_at(dir, args, &format!("file://{}", page.display()))
}

/// The same on the address `url`.
fn chromium_at(dir: &Path, args: &[&str], url: &str) -> (String, String) {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.join("chromium").display()
        ))
        .args(args)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("cannot run chromium (apt-get install chromium): {e}"));
    assert!(out.status.success(), "chromium {args:?} failed");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `trapline report` of the trace of `dir`: the page's path.
fn report_page(dir: &TestDir) -> std::path::PathBuf {
    let page = dir.path().join("report.html");
    let mut cmd = Command::new(trapline());
    cmd.arg("report").arg(dir.trace()).arg("-o").arg(&page);
    let made = output_of(cmd, "trapline report");
    assert_eq!(made.code(), 0, "{}", made.describe());
    page
}

/// The lines of Chromium's log that are the page's console messages.
fn console(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains(":CONSOLE")).collect()
}

/// The number of points of the first `<polyline class="total" ...>`.
fn total_points(dom: &str) -> usize {
    let at = dom
        .find("<polyline class=\"total\" points=\"")
        .expect("the heap plot's line");
    let rest = &dom[at + "<polyline class=\"total\" points=\"".len()..];
    rest[..rest.find('"').unwrap()].split_whitespace().count()
}

#[test]
fn the_report_page_loads_in_chromium_with_the_runs_findings() {
    let dir = TestDir::new("report_html");
    let prog = compile_c(&dir, "sampled_leaks.c");
    let run = run(&dir, &["--profile"], &prog, &["double-free", "30000"]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let page = report_page(&dir);

    let (dom, log) = chromium(dir.path(), &["--dump-dom"], &page);
    assert_eq!(console(&log), Vec::<&str>::new(), "console messages");
    let node = marker_line("sampled_leaks.c", "NODE");
    for (what, text) in [
        (
            "the parse path's loss record",
            format!(
                "make_node (sampled_leaks.c:{node}) \u{2190} parse_request (sampled_leaks.c:{})",
                marker_line("sampled_leaks.c", "PARSE")
            ),
        ),
        (
            "the load path's loss record",
            format!(
                "make_node (sampled_leaks.c:{node}) \u{2190} load_config (sampled_leaks.c:{})",
                marker_line("sampled_leaks.c", "LOAD")
            ),
        ),
        (
            "its bytes",
            "<td class=\"num\" data-sort=\"24000000\">24,000,000</td>".to_string(),
        ),
        (
            "the definitely lost card",
            "<div class=\"card\" id=\"definitely-lost\"><div class=\"value\">25,200,000 bytes</div>"
                .to_string(),
        ),
        ("the double free", "<td>double free</td>".to_string()),
        ("the exit scan's mark", "exit scan at".to_string()),
    ] {
        assert!(dom.contains(&text), "{what}: {text} not in the DOM");
    }
    assert_eq!(total_points(&dom), 240, "the heap plot's points");
    assert!(dom.matches("<polygon class=\"site\"").count() >= 2);
    // Bytes allocated, bytes live at the end, CPU.
    assert_eq!(dom.matches("<img class=\"flame\"").count(), 3);

    let shot = dir.path().join("report.png");
    let (_, log) = chromium(
        dir.path(),
        &[
            "--window-size=1200,1600",
            &format!("--screenshot={}", shot.display()),
        ],
        &page,
    );
    assert_eq!(console(&log), Vec::<&str>::new(), "console messages");
    let png = std::fs::read(&shot).expect("the screenshot");
    assert_eq!(&png[1..4], b"PNG");
    assert!(png.len() > 20_000, "a screenshot of {} bytes", png.len());
}

/// An existing page is kept without --force; a missing trace is an error
/// that writes nothing.
#[test]
fn report_refuses_what_it_cannot_do() {
    let dir = TestDir::new("report_refusals");
    let page = dir.path().join("kept.html");
    std::fs::write(&page, "mine").unwrap();
    let mut cmd = Command::new(trapline());
    cmd.arg("report")
        .arg(dir.path().join("none.trace"))
        .arg("-o")
        .arg(&page);
    let out = output_of(cmd, "trapline report");
    assert_eq!(out.code(), 1, "{}", out.describe());
    assert!(
        out.stderr.contains("exists; --force replaces it"),
        "{}",
        out.stderr
    );
    let mut cmd = Command::new(trapline());
    cmd.arg("report")
        .arg(dir.path().join("none.trace"))
        .arg("-o")
        .arg(&page)
        .arg("--force");
    let out = output_of(cmd, "trapline report");
    assert_eq!(out.code(), 1, "{}", out.describe());
    assert!(
        out.stderr.contains("none.trace: cannot open"),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read_to_string(&page).unwrap(), "mine");
    // A directory is no page, even with --force.
    let mut cmd = Command::new(trapline());
    cmd.arg("report")
        .arg(dir.path().join("none.trace"))
        .arg("-o")
        .arg(dir.path())
        .arg("--force");
    let out = output_of(cmd, "trapline report -o DIR");
    assert_eq!(out.code(), 1, "{}", out.describe());
    assert!(
        out.stderr.contains("is a directory: name a file to write"),
        "{}",
        out.stderr
    );
    // Its own input is never replaced, even with --force.
    let trace = dir.path().join("g.trace");
    std::fs::write(&trace, b"TRAPLINE and the rest of a trace").unwrap();
    let mut cmd = Command::new(trapline());
    cmd.arg("report")
        .arg(&trace)
        .arg("-o")
        .arg(&trace)
        .arg("--force");
    let out = output_of(cmd, "trapline report");
    assert_eq!(out.code(), 1, "{}", out.describe());
    assert!(
        out.stderr
            .contains("g.trace: is a trace this command reads"),
        "{}",
        out.stderr
    );
    assert_eq!(
        std::fs::read(&trace).unwrap(),
        b"TRAPLINE and the rest of a trace"
    );
}

/// Two runs in one page, a tab each: lock_orders.c's AB/BA order, drawn as
/// a cycle of its two locks, and lock_deadlock.c hung until --timeout,
/// drawn as its two threads each waiting for the other, with the lines
/// where each asked and took.
#[test]
fn the_report_draws_lock_cycles_and_a_real_deadlock_in_chromium() {
    let dir = TestDir::new("report_locks");
    let orders = compile_c(&dir, "lock_orders.c");
    let r = run(&dir, &[], &orders, &["ab"]);
    assert_eq!(r.code(), 0, "{}", r.describe());
    let ab = dir.path().join("ab.trace");
    std::fs::rename(dir.trace(), &ab).unwrap();

    let hung = compile_c(&dir, "lock_deadlock.c");
    let r = run(&dir, &["--timeout", "3"], &hung, &[]);
    assert_eq!(r.code(), 124, "{}", r.describe());

    let page = dir.path().join("locks.html");
    let mut cmd = Command::new(trapline());
    cmd.arg("report")
        .arg(&ab)
        .arg(dir.trace())
        .arg("-o")
        .arg(&page);
    let made = output_of(cmd, "trapline report");
    assert_eq!(made.code(), 0, "{}", made.describe());
    let (dom, log) = chromium(dir.path(), &["--dump-dom"], &page);
    assert_eq!(console(&log), Vec::<&str>::new(), "console messages");

    assert_eq!(dom.matches("<button class=\"tab").count(), 2);
    let cycle = analysis_json("deadlocks", &ab);
    let cycles = as_array(&cycle, "cycles");
    assert_eq!(cycles.len(), 1, "{}", pretty(&cycle));
    assert_eq!(dom.matches("<figure class=\"cycle\">").count(), 1);
    assert!(
        dom.contains(&format!(
            "<figcaption>{} cycle of 2 locks, seen {} times</figcaption>",
            cycles[0]["kind"].as_str().unwrap().replace('_', " "),
            cycles[0]["occurrences"]
        )),
        "the cycle's caption"
    );

    assert_eq!(dom.matches("<figure class=\"deadlock\">").count(), 1);
    assert!(dom.contains("<figcaption>deadlock of 2 threads at the end of the run</figcaption>"));
    let line = |m: &str| marker_line("lock_deadlock.c", m);
    for (asks, takes) in [
        ("ONE-WAITS-B", "TWO-HOLDS-B"),
        ("TWO-WAITS-A", "ONE-HOLDS-A"),
    ] {
        let (f, g) = if asks.starts_with("ONE") {
            ("one", "two")
        } else {
            ("two", "one")
        };
        let asked = format!("<td>{f} (lock_deadlock.c:{}) \u{2190} ", line(asks));
        let taken = format!("</td><td>{g} (lock_deadlock.c:{}) \u{2190} ", line(takes));
        assert!(
            dom.split("<tr>")
                .any(|row| row.contains(&asked) && row.contains(&taken)),
            "no row with {asked} and {taken}"
        );
    }
    // Two figures, two arrows each (the cycle's two edges, the deadlock's
    // two waits).
    assert_eq!(dom.matches("<line class=\"edge\"").count(), 4);
}

/// The report's card said "definitely lost" for the leaders' own bytes and
/// its table "definitely lost" for those plus the blocks lost through them
/// (101,808 against 825,776 on a real service). Now both follow memcheck's
/// LEAK SUMMARY: a card for each kind, and a record's bytes as memcheck
/// words them.
#[test]
fn the_cards_and_the_table_count_lost_bytes_alike() {
    let dir = TestDir::new("report_lost_kinds");
    let prog = compile_c(&dir, "reach_chains.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let page = report_page(&dir);
    let html = std::fs::read_to_string(&page).unwrap();
    for text in [
        "<div class=\"card\" id=\"definitely-lost\"><div class=\"value\">32 bytes</div>",
        "<div class=\"card\" id=\"indirectly-lost\"><div class=\"value\">64 bytes</div>",
        "<td>definitely lost</td><td class=\"num\" data-sort=\"96\">96 (32 direct, 64 indirect)</td>",
    ] {
        assert!(html.contains(text), "{text} not in the page");
    }
}

/// The leaks table's rows, in the page's order: (kind, bytes).
fn leak_rows(dom: &str) -> Vec<(String, u64)> {
    let at = dom
        .find("<table class=\"leaks sortable\"")
        .expect("the leaks table");
    let table = &dom[at..at + dom[at..].find("</table>").unwrap()];
    table
        .split("<tr>")
        .skip(2)
        .map(|row| {
            let kind = row["<td>".len()..row.find("</td>").unwrap()].to_owned();
            let from = row.find("data-sort=\"").expect("a sort key") + "data-sort=\"".len();
            let bytes = row[from..from + row[from..].find('"').unwrap()]
                .parse()
                .unwrap();
            (kind, bytes)
        })
        .collect()
}

/// Each heading sorts its column; the page opens sorted as the analysis
/// ranked (bytes, descending), or as its address says.
#[test]
fn the_reports_tables_sort_by_any_column() {
    let dir = TestDir::new("report_sort");
    let prog = compile_c(&dir, "leaks.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let page = report_page(&dir);
    let url = format!("file://{}", page.display());
    let (dom, log) = chromium_at(dir.path(), &["--dump-dom"], &url);
    assert_eq!(console(&log), Vec::<&str>::new(), "console messages");
    let ranked = leak_rows(&dom);
    assert_eq!(ranked.len(), 7, "{ranked:?}");
    let mut descending = ranked.clone();
    descending.sort_by_key(|r| std::cmp::Reverse(r.1));
    assert_eq!(ranked, descending);
    assert!(
        dom.contains("<th aria-sort=\"descending\"><button type=\"button\">bytes</button></th>")
    );

    let (dom, log) = chromium_at(
        dir.path(),
        &["--dump-dom"],
        &format!("{url}#sort=leaks:1:ascending"),
    );
    assert_eq!(console(&log), Vec::<&str>::new(), "console messages");
    let mut ascending = ranked.clone();
    ascending.reverse();
    assert_eq!(leak_rows(&dom), ascending);
    assert!(dom.contains("<th aria-sort=\"ascending\"><button type=\"button\">bytes</button></th>"));
    let at = dom.find("<table class=\"leaks sortable\"").unwrap();
    let head = &dom[at..at + dom[at..].find("</thead>").unwrap()];
    assert_eq!(head.matches("aria-sort=").count(), 1, "{head}");

    // Text columns sort as text; equal keys keep the ranked order.
    let (dom, _) = chromium_at(
        dir.path(),
        &["--dump-dom"],
        &format!("{url}#sort=leaks:0:ascending"),
    );
    let mut by_kind = ranked.clone();
    by_kind.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(leak_rows(&dom), by_kind);
}
