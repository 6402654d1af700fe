//! Distributions, tables and the files they end up in: every part hands back a [`Part`]
//! (its table for people and its figures as JSON), and `main` prints and writes them.

use reactor::sense::lag::format_ns;
use serde_json::{json, Value};

/// A sample's p50, p99 and max (nearest rank), or nothing for no samples.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dist {
    /// How many samples.
    pub n: usize,
    /// Median.
    pub p50: u64,
    /// 99th percentile (nearest rank: the max below 100 samples).
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

impl Dist {
    /// The distribution of `samples` (any order).
    pub fn of(samples: &[u64]) -> Dist {
        if samples.is_empty() {
            return Dist::default();
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        let at = |q: f64| s[((s.len() as f64 * q).ceil() as usize).clamp(1, s.len()) - 1];
        Dist {
            n: s.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: at(1.0),
        }
    }

    /// The figures as JSON (nanoseconds), `null`s with no samples.
    pub fn json(&self) -> Value {
        if self.n == 0 {
            return json!({"n": 0, "p50_ns": null, "p99_ns": null, "max_ns": null});
        }
        json!({"n": self.n, "p50_ns": self.p50, "p99_ns": self.p99, "max_ns": self.max})
    }

    /// `p50` as text, `-` with no samples.
    pub fn p50_text(&self) -> String {
        self.text(self.p50)
    }

    /// `p99` as text.
    pub fn p99_text(&self) -> String {
        self.text(self.p99)
    }

    /// `max` as text.
    pub fn max_text(&self) -> String {
        self.text(self.max)
    }

    fn text(&self, v: u64) -> String {
        if self.n == 0 {
            "-".into()
        } else {
            format_ns(v)
        }
    }
}

/// `a / b` as text (`1234x`, `0.8x`), `-` when either is missing.
pub fn ratio(a: Option<u64>, b: Option<u64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0 => {
            let r = a as f64 / b as f64;
            if r >= 100.0 {
                format!("{r:.0}x")
            } else if r >= 10.0 {
                format!("{r:.1}x")
            } else {
                format!("{r:.2}x")
            }
        }
        _ => "-".into(),
    }
}

/// `a / b` as a number for the JSON, `null` when either is missing.
pub fn ratio_json(a: Option<u64>, b: Option<u64>) -> Value {
    match (a, b) {
        (Some(a), Some(b)) if b > 0 => json!(a as f64 / b as f64),
        _ => Value::Null,
    }
}

/// One table: a title, column headers, rows and notes under it.
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// What the table shows.
    pub title: String,
    /// Column headers.
    pub header: Vec<String>,
    /// Rows, as many cells as headers.
    pub rows: Vec<Vec<String>>,
    /// Lines printed under the table (what was measured, how, caveats).
    pub notes: Vec<String>,
    /// How many leading columns hold words (left-aligned); the rest are figures.
    pub text_columns: usize,
}

impl Table {
    /// An empty table with `title` and `header`.
    pub fn new(title: &str, header: &[&str]) -> Table {
        Table {
            title: title.to_string(),
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
            text_columns: 1,
        }
    }

    /// The same table with its first `n` columns left-aligned.
    pub fn text_columns(mut self, n: usize) -> Table {
        self.text_columns = n;
        self
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Adds a note.
    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                if let Some(x) = w.get_mut(i) {
                    *x = (*x).max(c.chars().count());
                }
            }
        }
        w
    }

    /// The table for a terminal: aligned columns.
    pub fn text(&self) -> String {
        let w = self.widths();
        let line = |cells: &[String]| -> String {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                let pad = w.get(i).copied().unwrap_or(0);
                // First column left-aligned (names), figures right-aligned.
                if i < self.text_columns {
                    s.push_str(&format!("  {c:<pad$}"));
                } else {
                    s.push_str(&format!("  {c:>pad$}"));
                }
            }
            s.trim_end().to_string()
        };
        let mut out = format!("{}\n", self.title);
        out.push_str(&line(&self.header));
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        for n in &self.notes {
            out.push_str(&format!("  note: {n}\n"));
        }
        out
    }

    /// The table as GitHub markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!("#### {}\n\n", self.title);
        out.push_str(&format!("| {} |\n", self.header.join(" | ")));
        let align: Vec<&str> = (0..self.header.len())
            .map(|i| if i < self.text_columns { "---" } else { "---:" })
            .collect();
        out.push_str(&format!("| {} |\n", align.join(" | ")));
        for r in &self.rows {
            out.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                out.push_str(&format!("- {n}\n"));
            }
        }
        out
    }
}

/// What one part produced.
pub struct Part {
    /// Short key (`lag`, `oom`, ...), the JSON member's name.
    pub key: &'static str,
    /// The tables to print.
    pub tables: Vec<Table>,
    /// Every figure.
    pub json: Value,
    /// How many samples the part's figures rest on: 0 means the harness measured nothing.
    pub samples: usize,
}
