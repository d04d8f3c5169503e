//! Line charts as plain SVG: axes with round ticks, one polyline per series, a legend, and
//! optional horizontal reference lines (an SLO, say). Enough for the benchmark report; no
//! dependency, and the files diff as text.

use std::fmt::Write as _;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 80.0;
/// Colours that stay apart for readers with the common colour-vision deficiencies.
const COLOURS: [&str; 6] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
];

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Horizontal lines across the plot: (y, label).
    pub marks: Vec<(f64, String)>,
    /// A logarithmic y axis (latencies spanning decades).
    pub log_y: bool,
}

/// Round tick values covering `lo..=hi`, about `n` of them.
pub fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return vec![lo];
    }
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).floor() * step;
    let mut out = Vec::new();
    let mut v = first;
    while v <= hi + step * 1e-9 && out.len() < 50 {
        out.push(v);
        v += step;
    }
    if out.last().is_some_and(|l| *l < hi) {
        out.push(v);
    }
    out
}

fn label(v: f64) -> String {
    if v.abs() >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Chart {
    pub fn render(&self) -> String {
        let points = self.series.iter().flat_map(|s| s.points.iter());
        let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in points.filter(|(x, y)| x.is_finite() && y.is_finite()) {
            x_lo = x_lo.min(x);
            x_hi = x_hi.max(x);
            y_lo = y_lo.min(y);
            y_hi = y_hi.max(y);
        }
        for (y, _) in &self.marks {
            y_lo = y_lo.min(*y);
            y_hi = y_hi.max(*y);
        }
        if x_lo > x_hi {
            (x_lo, x_hi, y_lo, y_hi) = (0.0, 1.0, 0.0, 1.0);
        }
        let (fy, y_ticks): (Box<dyn Fn(f64) -> f64>, Vec<f64>) = if self.log_y {
            let lo = y_lo.max(1e-3).log10().floor();
            let hi = y_hi.max(1e-3).log10().ceil().max(lo + 1.0);
            let t: Vec<f64> = (lo as i32..=hi as i32).map(|e| 10f64.powi(e)).collect();
            (
                Box::new(move |y: f64| (y.max(1e-3).log10() - lo) / (hi - lo)),
                t,
            )
        } else {
            let t = ticks(y_lo.min(0.0), y_hi, 5);
            let (lo, hi) = (t[0], *t.last().unwrap_or(&1.0));
            let span = (hi - lo).max(1e-9);
            (Box::new(move |y: f64| (y - lo) / span), t)
        };
        let x_ticks = ticks(x_lo.min(0.0), x_hi, 8);
        let (xl, xh) = (x_ticks[0], *x_ticks.last().unwrap_or(&1.0));
        let (pw, ph) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
        let px = |x: f64| LEFT + (x - xl) / (xh - xl).max(1e-9) * pw;
        let py = |y: f64| TOP + ph - fy(y).clamp(0.0, 1.0) * ph;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = write!(
            s,
            r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
            WIDTH / 2.0,
            escape(&self.title)
        );
        for t in &y_ticks {
            let y = py(*t);
            let _ = write!(
                s,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                label(*t)
            );
        }
        for t in &x_ticks {
            let x = px(*t);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
                TOP + ph,
                TOP + ph + 16.0,
                label(*t)
            );
        }
        let _ = write!(
            s,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/><text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text>"##,
            LEFT + pw / 2.0,
            TOP + ph + 36.0,
            escape(&self.x_label),
            TOP + ph / 2.0,
            escape(&self.y_label)
        );
        for (y, text) in &self.marks {
            let y = py(*y);
            let _ = write!(
                s,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#900" stroke-dasharray="2 3"/><text x="{}" y="{:.1}" fill="#900" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT + pw - 4.0,
                y - 4.0,
                escape(text)
            );
        }
        for (i, series) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let path: Vec<String> = series
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let dash = if series.dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let _ = write!(
                s,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"/>"#,
                path.join(" ")
            );
            if path.len() <= 20 {
                for p in &path {
                    let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
                    let _ = write!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
                }
            }
            let (lx, ly) = (
                LEFT + (i % 3) as f64 * 240.0,
                HEIGHT - 24.0 + (i / 3) as f64 * 16.0,
            );
            let _ = write!(
                s,
                r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
                lx + 22.0,
                lx + 28.0,
                ly + 4.0,
                escape(&series.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(0.0, 8_350.0, 5);
        assert_eq!(t.first(), Some(&0.0));
        assert!(*t.last().unwrap() >= 8_350.0);
        assert!(
            t.windows(2).all(|w| (w[1] - w[0] - 2_000.0).abs() < 1e-6),
            "{t:?}"
        );
        assert_eq!(ticks(5.0, 5.0, 5), vec![5.0]);
    }

    #[test]
    fn a_chart_draws_each_series_its_legend_and_its_marks() {
        let chart = Chart {
            title: "p99 <latency>".into(),
            x_label: "offered".into(),
            y_label: "ms".into(),
            series: vec![
                Series {
                    name: "platform".into(),
                    points: vec![(1000.0, 2.0), (2000.0, 3.0), (4000.0, 80.0)],
                    dashed: false,
                },
                Series {
                    name: "naive".into(),
                    points: vec![(500.0, 5.0), (1000.0, 400.0), (f64::NAN, 1.0)],
                    dashed: true,
                },
            ],
            marks: vec![(50.0, "SLO 50 ms".into())],
            log_y: true,
        };
        let svg = chart.render();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("p99 &lt;latency&gt;"));
        assert!(svg.contains(">platform<") && svg.contains(">naive<"));
        assert!(svg.contains("SLO 50 ms"));
        assert!(!svg.contains("NaN"));
    }
}
