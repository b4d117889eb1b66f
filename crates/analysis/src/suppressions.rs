//! Leak suppressions, in LeakSanitizer's form (`leak:PATTERN` lines) and in
//! Valgrind's (`{ name  Memcheck:Leak  [match-leak-kinds: ...]  fun:/obj:/src:/... }`).
//!
//! - LeakSanitizer: a record is hidden when PATTERN matches the function
//!   name, source file or module path of any frame of its allocation stack.
//!   `*` matches any run of characters; the pattern may match anywhere in
//!   the name unless anchored with `^` (start) or `$` (end).
//! - Valgrind: the frame lines must match the innermost frames in order, the
//!   first one being the allocation function (`fun:malloc`, `fun:_Znwm`);
//!   `...` matches any number of frames; `*` and `?` are wildcards and a
//!   pattern must match the whole name. `match-leak-kinds` limits the kinds
//!   (`definite`, `indirect`, `possible`, `reachable`, `all`); without it
//!   every kind matches. Suppressions of other Valgrind kinds never match.

use crate::report::FrameReport;
use trapline_trace::{AllocFn, Verdict};

/// One suppression read from a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suppression {
    /// Its name: the Valgrind block's name, or the LeakSanitizer line itself.
    pub name: String,
    /// `file:line` where it was read.
    pub source: String,
    rule: Rule,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    Lsan(String),
    Valgrind {
        leak: bool,
        kinds: Option<Vec<Verdict>>,
        frames: Vec<FramePattern>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum FramePattern {
    Fun(String),
    Obj(String),
    Src(String),
    AnyFrames,
}

/// Reads a suppression file's text; `file` names it in errors and sources.
pub fn parse(text: &str, file: &str) -> Result<Vec<Suppression>, String> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
    while let Some((n, line)) = lines.next() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line == "{" {
            out.push(parse_valgrind(&mut lines, file, n)?);
        } else if let Some(pattern) = line.strip_prefix("leak:") {
            out.push(Suppression {
                name: line.to_string(),
                source: format!("{file}:{n}"),
                rule: Rule::Lsan(pattern.trim().to_string()),
            });
        } else if line.contains(':') && !line.starts_with('{') {
            // Other LeakSanitizer/sanitizer kinds (called_from_lib:, race:, ...).
            continue;
        } else {
            return Err(format!(
                "{file}:{n}: expected `leak:PATTERN` or a Valgrind suppression starting with `{{`, found `{line}`"
            ));
        }
    }
    Ok(out)
}

fn parse_valgrind<'a>(
    lines: &mut impl Iterator<Item = (usize, &'a str)>,
    file: &str,
    start: usize,
) -> Result<Suppression, String> {
    let unterminated = || format!("{file}:{start}: Valgrind suppression without its closing `}}`");
    let (_, name) = lines.next().ok_or_else(unterminated)?;
    let (n, tool_kind) = lines.next().ok_or_else(unterminated)?;
    let leak = match tool_kind.split_once(':') {
        Some((tools, kind)) => {
            tools.split(',').any(|t| t.trim() == "Memcheck") && kind.trim() == "Leak"
        }
        None => {
            return Err(format!(
                "{file}:{n}: expected `Tool:Kind`, found `{tool_kind}`"
            ))
        }
    };
    let mut kinds = None;
    let mut frames = Vec::new();
    for (n, line) in lines.by_ref() {
        if line == "}" {
            return Ok(Suppression {
                name: name.to_string(),
                source: format!("{file}:{start}"),
                rule: Rule::Valgrind {
                    leak,
                    kinds,
                    frames,
                },
            });
        }
        if let Some(list) = line.strip_prefix("match-leak-kinds:") {
            kinds =
                Some(leak_kinds(list).map_err(|k| format!("{file}:{n}: unknown leak kind `{k}`"))?);
        } else if line == "..." {
            frames.push(FramePattern::AnyFrames);
        } else if let Some(p) = line.strip_prefix("fun:") {
            frames.push(FramePattern::Fun(p.to_string()));
        } else if let Some(p) = line.strip_prefix("obj:") {
            frames.push(FramePattern::Obj(p.to_string()));
        } else if let Some(p) = line.strip_prefix("src:") {
            frames.push(FramePattern::Src(p.to_string()));
        } else if !line.is_empty() && !line.starts_with('#') {
            // Extra lines of other kinds (e.g. `Memcheck:Param`'s syscall name).
            if leak {
                return Err(format!(
                    "{file}:{n}: unexpected line `{line}` in a leak suppression"
                ));
            }
        }
    }
    Err(unterminated())
}

/// Parses a list like `definite,possible` (also `all` and `none`).
pub fn leak_kinds(list: &str) -> Result<Vec<Verdict>, String> {
    let mut out = Vec::new();
    for k in list.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        match k {
            "definite" => out.push(Verdict::DefinitelyLost),
            "indirect" => out.push(Verdict::IndirectlyLost),
            "possible" => out.push(Verdict::PossiblyLost),
            "reachable" => out.push(Verdict::StillReachable),
            "all" => out.extend(Verdict::ALL),
            "none" => {}
            other => return Err(other.to_string()),
        }
    }
    Ok(out)
}

/// `*` any run, `?` any one character; the whole text must match.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        Some((&c, rest)) => text
            .split_first()
            .is_some_and(|(&t, tail)| (c == b'?' || c == t) && glob(rest, tail)),
    }
}

/// LeakSanitizer's matching: anywhere, unless anchored by `^` or `$`.
fn lsan_match(pattern: &str, text: &str) -> bool {
    let (start, p) = match pattern.strip_prefix('^') {
        Some(p) => (true, p),
        None => (false, pattern),
    };
    let (end, p) = match p.strip_suffix('$') {
        Some(p) => (true, p),
        None => (false, p),
    };
    let mut full = String::new();
    if !start {
        full.push('*');
    }
    full.push_str(p);
    if !end {
        full.push('*');
    }
    glob(full.as_bytes(), text.as_bytes())
}

/// The Itanium-mangled names of the C++ allocation functions, as Valgrind
/// suppressions spell them.
fn mangled(func: AllocFn) -> &'static str {
    match func.name() {
        "operator new(unsigned long)" => "_Znwm",
        "operator new[](unsigned long)" => "_Znam",
        "operator new(unsigned long, std::nothrow_t const&)" => "_ZnwmRKSt9nothrow_t",
        "operator new[](unsigned long, std::nothrow_t const&)" => "_ZnamRKSt9nothrow_t",
        "operator new(unsigned long, std::align_val_t)" => "_ZnwmSt11align_val_t",
        "operator new[](unsigned long, std::align_val_t)" => "_ZnamSt11align_val_t",
        other => other,
    }
}

/// Frames a generated suppression names at most (memcheck's default
/// `--num-callers` is 12).
pub const GENERATED_FRAMES: usize = 12;

/// A Valgrind suppression that hides exactly a loss record like this one: its
/// kind (none for an unjudged record: any kind), the allocation function and
/// the innermost frames of its stack (`fun:` where the function is known,
/// `obj:` where only the module is, `...` for a frame with neither), as
/// memcheck's `--gen-suppressions` prints them.
pub fn generate(kind: &str, func: AllocFn, stack: &[FrameReport]) -> String {
    let mut lines = vec![
        "{".to_string(),
        "   <insert_a_suppression_name_here>".to_string(),
        "   Memcheck:Leak".to_string(),
    ];
    if let Some(k) = Verdict::ALL
        .into_iter()
        .find(|v| v.name() == kind)
        .map(memcheck_kind)
    {
        lines.push(format!("   match-leak-kinds: {k}"));
    }
    lines.push(format!("   fun:{}", mangled(func)));
    for f in stack.iter().take(GENERATED_FRAMES - 1) {
        lines.push(match (&f.function, &f.module) {
            (Some(name), _) => format!("   fun:{name}"),
            (None, Some(module)) => format!("   obj:{module}"),
            (None, None) => "   ...".to_string(),
        });
    }
    lines.push("}".to_string());
    lines.join("\n")
}

/// memcheck's name of a leak kind in `match-leak-kinds`.
fn memcheck_kind(v: Verdict) -> &'static str {
    match v {
        Verdict::DefinitelyLost => "definite",
        Verdict::IndirectlyLost => "indirect",
        Verdict::PossiblyLost => "possible",
        _ => "reachable",
    }
}

impl Suppression {
    /// Whether this suppression hides a loss record.
    pub fn matches(&self, verdict: Verdict, func: AllocFn, stack: &[FrameReport]) -> bool {
        match &self.rule {
            Rule::Lsan(p) => stack.iter().any(|f| {
                [
                    f.function.as_deref(),
                    f.file.as_deref(),
                    f.module.as_deref(),
                ]
                .into_iter()
                .flatten()
                .any(|name| lsan_match(p, name))
            }),
            Rule::Valgrind {
                leak,
                kinds,
                frames,
            } => {
                *leak
                    && kinds.as_ref().is_none_or(|k| k.contains(&verdict))
                    && frames_match(frames, func, stack)
            }
        }
    }
}

/// One frame as Valgrind matching sees it.
struct VgFrame<'a> {
    functions: [Option<&'a str>; 2],
    module: Option<&'a str>,
    source: Option<String>,
}

fn frames_match(patterns: &[FramePattern], func: AllocFn, stack: &[FrameReport]) -> bool {
    let top = VgFrame {
        functions: [Some(func.name()), Some(mangled(func))],
        module: None,
        source: None,
    };
    let frames: Vec<VgFrame<'_>> = std::iter::once(top)
        .chain(stack.iter().map(|f| VgFrame {
            functions: [f.function.as_deref(), None],
            module: f.module.as_deref(),
            source: f.file.as_ref().map(|file| {
                let base = file.rsplit('/').next().unwrap_or(file);
                format!("{base}:{}", f.line.unwrap_or(0))
            }),
        }))
        .collect();
    match_from(patterns, &frames)
}

fn match_from(patterns: &[FramePattern], frames: &[VgFrame<'_>]) -> bool {
    let Some((p, rest)) = patterns.split_first() else {
        // A suppression matches a prefix of the stack.
        return true;
    };
    if let FramePattern::AnyFrames = p {
        return (0..=frames.len()).any(|i| match_from(rest, &frames[i..]));
    }
    let Some((f, tail)) = frames.split_first() else {
        return false;
    };
    let ok = match p {
        FramePattern::Fun(pat) => f
            .functions
            .iter()
            .flatten()
            .any(|name| glob(pat.as_bytes(), name.as_bytes())),
        FramePattern::Obj(pat) => f.module.is_some_and(|m| glob(pat.as_bytes(), m.as_bytes())),
        FramePattern::Src(pat) => f.source.as_deref().is_some_and(|s| {
            glob(pat.as_bytes(), s.as_bytes())
                || glob(pat.as_bytes(), s.split(':').next().unwrap_or("").as_bytes())
        }),
        FramePattern::AnyFrames => unreachable!(),
    };
    ok && match_from(rest, tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str, module: &str) -> FrameReport {
        FrameReport {
            address: 0x1000,
            function: Some(function.to_string()),
            file: Some(file.to_string()),
            line: Some(12),
            inlined: false,
            module: Some(module.to_string()),
            allocation_wrapper: false,
        }
    }

    #[test]
    fn lsan_patterns_match_function_file_or_module_anywhere_unless_anchored() {
        let s = parse("# comment\nleak:make_cache\nleak:^libfoo\n", "s.supp").unwrap();
        let stack = [frame(
            "make_cache_entry",
            "/src/cache.c",
            "/usr/lib/libbar.so",
        )];
        assert!(s[0].matches(Verdict::DefinitelyLost, AllocFn::Malloc, &stack));
        assert!(!s[1].matches(Verdict::DefinitelyLost, AllocFn::Malloc, &stack));
        let stack = [frame("main", "/src/main.c", "libfoo.so.1")];
        assert!(s[1].matches(Verdict::PossiblyLost, AllocFn::Malloc, &stack));
        assert!(!s[0].matches(Verdict::PossiblyLost, AllocFn::Malloc, &stack));
    }

    #[test]
    fn valgrind_frames_match_in_order_from_the_allocation_function() {
        let text = "{\n  cache\n  Memcheck:Leak\n  match-leak-kinds: definite\n  fun:malloc\n  fun:make_*\n  ...\n  fun:main\n}\n";
        let s = parse(text, "v.supp").unwrap();
        assert_eq!(s[0].name, "cache");
        let stack = [
            frame("make_cache", "c.c", "a.out"),
            frame("helper", "c.c", "a.out"),
            frame("main", "c.c", "a.out"),
        ];
        assert!(s[0].matches(Verdict::DefinitelyLost, AllocFn::Malloc, &stack));
        assert!(!s[0].matches(Verdict::PossiblyLost, AllocFn::Malloc, &stack));
        assert!(!s[0].matches(Verdict::DefinitelyLost, AllocFn::Calloc, &stack));
        let cxx = parse(
            "{\n n\n Memcheck:Leak\n fun:_Znwm\n fun:make_cache\n}\n",
            "v",
        )
        .unwrap();
        assert!(cxx[0].matches(Verdict::IndirectlyLost, AllocFn::New, &stack));
    }

    #[test]
    fn bad_suppression_files_are_errors_naming_the_line() {
        let e = parse("leak:x\nnonsense\n", "bad.supp").unwrap_err();
        assert!(e.starts_with("bad.supp:2:"), "{e}");
        let e = parse("{\n name\n Memcheck:Leak\n fun:malloc\n", "open.supp").unwrap_err();
        assert!(e.contains("closing"), "{e}");
        assert!(leak_kinds("definite,bogus").is_err());
    }
}
