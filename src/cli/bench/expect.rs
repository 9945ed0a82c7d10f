//! `bench --expect-path CLASS=PATH[,…]` (issue 43): proof that each class took the execution
//! path the operator intended, the canary check of a capture-size or routing change.
//!
//! A class meets `CLASS=PATH` when it has at least one successful request and every successful
//! request of it took `PATH`, as the report's `by_path` names paths
//! (`infergate_engine::exec_path::request_path`: `eager`: no graph step; `mixed`: some step
//! took it past the captured budget, by its own prefill chunk or beside another's; else
//! `graph`; without a flight record, at most its prefill step may run eagerly). Failed requests are left out (their path is not known); a successful request whose
//! path was not reported counts as missing the path.

use std::collections::BTreeMap;

use crate::report::RequestRecord;

/// The path names an expectation may use.
pub const PATHS: [&str; 3] = ["graph", "eager", "mixed"];

/// One `CLASS=PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// Workload class.
    pub class: String,
    /// `graph`, `eager` or `mixed`.
    pub path: String,
}

/// How one expectation fared.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The expectation.
    pub expect: Expectation,
    /// Successful requests of the class.
    pub ok: u64,
    /// Of which took the path.
    pub took: u64,
    /// Successful requests of the class by the path they took (`unknown` when not reported).
    pub by_path: BTreeMap<String, u64>,
}

impl Verdict {
    /// Whether the class met its expectation.
    pub fn passed(&self) -> bool {
        self.ok > 0 && self.took == self.ok
    }

    /// The share of its successful requests that took the path.
    pub fn share(&self) -> f64 {
        if self.ok == 0 {
            0.0
        } else {
            self.took as f64 / self.ok as f64
        }
    }

    /// One line for the report: what was expected, the share that did it, where the rest went.
    pub fn line(&self) -> String {
        let e = &self.expect;
        let paths: Vec<String> = self
            .by_path
            .iter()
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
        format!(
            "expect-path {}={}: {} — {:.1}% of {} successful requests took {} ({})",
            e.class,
            e.path,
            if self.passed() { "ok" } else { "MISSED" },
            self.share() * 100.0,
            self.ok,
            e.path,
            if paths.is_empty() {
                "none".to_owned()
            } else {
                paths.join(", ")
            }
        )
    }
}

/// Parses the flags' values (each `CLASS=PATH[,CLASS=PATH…]`); every malformed item is
/// reported, as is a class named twice.
pub fn parse(flags: &[String]) -> Result<Vec<Expectation>, String> {
    let mut out: Vec<Expectation> = Vec::new();
    let mut bad = Vec::new();
    for item in flags.iter().flat_map(|f| f.split(',')).map(str::trim) {
        match item.split_once('=') {
            Some((class, path)) if !class.trim().is_empty() && PATHS.contains(&path.trim()) => {
                let class = class.trim().to_owned();
                if out.iter().any(|e| e.class == class) {
                    bad.push(format!("--expect-path names class `{class}` twice"));
                } else {
                    out.push(Expectation {
                        class,
                        path: path.trim().to_owned(),
                    });
                }
            }
            _ => bad.push(format!(
                "--expect-path `{item}` is not CLASS=PATH (PATH: graph, eager or mixed)"
            )),
        }
    }
    if bad.is_empty() {
        Ok(out)
    } else {
        Err(bad.join("\n"))
    }
}

/// Checks the classes named against the workload's; an unknown one is an error before the run.
pub fn check_classes(expect: &[Expectation], classes: &[&str]) -> Result<(), String> {
    let unknown: Vec<&str> = expect
        .iter()
        .map(|e| e.class.as_str())
        .filter(|c| !classes.contains(c))
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "--expect-path names {} not in the workload (its classes: {})",
            unknown
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", "),
            classes.join(", ")
        ))
    }
}

/// Judges each expectation on the run's records.
pub fn judge(expect: &[Expectation], records: &[RequestRecord]) -> Vec<Verdict> {
    expect
        .iter()
        .map(|e| {
            let mut v = Verdict {
                expect: e.clone(),
                ok: 0,
                took: 0,
                by_path: BTreeMap::new(),
            };
            let mine = records
                .iter()
                .filter(|r| r.ok() && r.class.as_deref() == Some(e.class.as_str()));
            for r in mine {
                v.ok += 1;
                let path = r.path.as_deref().unwrap_or("unknown");
                v.took += u64::from(path == e.path);
                *v.by_path.entry(path.to_owned()).or_default() += 1;
            }
            v
        })
        .collect()
}

/// The verdicts' lines, and an error naming every class that missed its path.
pub fn outcome(verdicts: &[Verdict]) -> (String, Result<(), String>) {
    let text: String = verdicts.iter().map(|v| v.line() + "\n").collect();
    let missed: Vec<String> = verdicts
        .iter()
        .filter(|v| !v.passed())
        .map(|v| {
            format!(
                "`{}` ({:.1}% of {} took {})",
                v.expect.class,
                v.share() * 100.0,
                v.ok,
                v.expect.path
            )
        })
        .collect();
    let result = if missed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "--expect-path: {} did not take the intended path: {}",
            if missed.len() == 1 {
                "a class"
            } else {
                "classes"
            },
            missed.join(", ")
        ))
    };
    (text, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(class: &str, path: &str) -> Expectation {
        Expectation {
            class: class.into(),
            path: path.into(),
        }
    }

    fn rec(class: &str, path: Option<&str>, status: u16) -> RequestRecord {
        RequestRecord {
            id: 0,
            tenant: None,
            class: Some(class.into()),
            worker: None,
            path: path.map(Into::into),
            shared: None,
            status,
            start: 0.0,
            ttft: Some(0.1),
            itl: vec![],
            e2e: 0.2,
            prompt_tokens: 1,
            output_tokens: 1,
            asked_output_tokens: 1,
            cached: None,
        }
    }

    #[test]
    fn expectations_parse_from_lists_and_repeated_flags() {
        let flags = vec!["short=graph, long=mixed".to_owned(), "img=eager".to_owned()];
        assert_eq!(
            parse(&flags).unwrap(),
            [
                exp("short", "graph"),
                exp("long", "mixed"),
                exp("img", "eager")
            ]
        );
        let err = parse(&["a=fast,=graph,b".to_owned(), "a=graph,a=eager".to_owned()]).unwrap_err();
        assert!(err.contains("`a=fast`"), "{err}");
        assert!(err.contains("`=graph`"), "{err}");
        assert!(err.contains("`b`"), "{err}");
        assert!(err.contains("class `a` twice"), "{err}");
        assert!(parse(&[]).unwrap().is_empty());
    }

    #[test]
    fn unknown_classes_are_named() {
        let e = [exp("short", "graph"), exp("huge", "mixed")];
        let err = check_classes(&e, &["short", "long"]).unwrap_err();
        assert!(err.contains("`huge`") && !err.contains("`short`"), "{err}");
        assert!(check_classes(&e[..1], &["short"]).is_ok());
    }

    #[test]
    fn a_class_passes_only_when_every_successful_request_took_the_path() {
        let records = vec![
            rec("short", Some("graph"), 200),
            rec("short", Some("graph"), 200),
            rec("short", None, 429),
            rec("long", Some("mixed"), 200),
            rec("long", Some("graph"), 200),
            rec("long", None, 200),
            rec("rare", None, 503),
        ];
        let e = [
            exp("short", "graph"),
            exp("long", "mixed"),
            exp("rare", "mixed"),
        ];
        let v = judge(&e, &records);
        assert!(v[0].passed(), "a refused request has no path to miss");
        assert_eq!((v[0].ok, v[0].took), (2, 2));
        assert!(!v[1].passed());
        assert!((v[1].share() - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(v[1].by_path["unknown"], 1);
        assert!(!v[2].passed(), "no successful request proves nothing");
        let (text, result) = outcome(&v);
        assert!(
            text.contains("expect-path short=graph: ok — 100.0% of 2"),
            "{text}"
        );
        assert!(text.contains("long=mixed: MISSED — 33.3% of 3"), "{text}");
        assert!(text.contains("(graph 1, mixed 1, unknown 1)"), "{text}");
        let err = result.unwrap_err();
        assert!(err.contains("`long`") && err.contains("`rare`"), "{err}");
        assert!(!err.contains("`short`"), "{err}");
        assert_eq!(outcome(&v[..1]).1, Ok(()));
    }
}
