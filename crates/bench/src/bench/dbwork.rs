//! The database work behind each order, database by database: the statements PostgreSQL ran
//! (`pg_stat_statements` calls, transaction control left out) and the transactions it
//! committed (`pg_stat_database.xact_commit`), over a mode, divided by the orders the mode
//! brought to its durable state — accepted for the naive design (durable when answered),
//! confirmed for the platform (the unit reserved in the database). The bench's own reads run
//! as a role of their own and are left out: their statements are not counted, and as each is a
//! transaction of its own, their number is taken off the commits.

use serde_json::{Value, json};

use super::counters::{Counters, PROBE_STATEMENTS, STATEMENTS, STATEMENTS_AVAILABLE};

/// One database's share.
#[derive(Clone, Debug, PartialEq)]
pub struct DbShare {
    /// Whose database: `product-stock`, `order`, `outbound`, `naive`.
    pub owner: String,
    pub statements: i64,
    pub commits: i64,
    pub exec_ms: f64,
}

/// The work over a mode and the orders it is divided by.
#[derive(Clone, Debug, PartialEq)]
pub struct DbWork {
    /// What an order had reached: `accepted` (naive), `confirmed` (platform).
    pub per: &'static str,
    pub orders: u64,
    pub shares: Vec<DbShare>,
}

/// The work between two readings in the databases `dbs` (`(owner, database name)`), `None`
/// when the readings hold no statement counts (the server has no `pg_stat_statements`).
pub fn between(
    before: &Counters,
    after: &Counters,
    dbs: &[(String, String)],
    per: &'static str,
    orders: u64,
) -> Option<DbWork> {
    if after.get(STATEMENTS_AVAILABLE) != 1 || before.get(STATEMENTS_AVAILABLE) != 1 {
        return None;
    }
    let delta = |key: String| after.get(&key) - before.get(&key);
    let shares = dbs
        .iter()
        .map(|(owner, db)| {
            let probe = delta(format!("{PROBE_STATEMENTS}{db}/calls"));
            DbShare {
                owner: owner.clone(),
                statements: delta(format!("{STATEMENTS}{db}/calls")),
                commits: (delta(format!("pgdb/{db}/xact_commit")) - probe).max(0),
                exec_ms: delta(format!("{STATEMENTS}{db}/exec_us")) as f64 / 1000.0,
            }
        })
        .collect();
    Some(DbWork {
        per,
        orders,
        shares,
    })
}

impl DbWork {
    /// Statements, commits and execution ms, over every database.
    pub fn totals(&self) -> (i64, i64, f64) {
        self.shares.iter().fold((0, 0, 0.0), |(s, c, e), d| {
            (s + d.statements, c + d.commits, e + d.exec_ms)
        })
    }

    /// `x / orders`, `None` with no order.
    fn per_order(&self, x: f64) -> Option<f64> {
        (self.orders > 0).then(|| x / self.orders as f64)
    }

    pub fn to_json(&self) -> Value {
        let (s, c, e) = self.totals();
        json!({
            "per": self.per,
            "orders": self.orders,
            "statementsPerOrder": self.per_order(s as f64),
            "commitsPerOrder": self.per_order(c as f64),
            "execMsPerOrder": self.per_order(e),
            "databases": self.shares.iter().map(|d| json!({
                "owner": d.owner,
                "statements": d.statements,
                "commits": d.commits,
                "execMs": d.exec_ms,
                "statementsPerOrder": self.per_order(d.statements as f64),
                "commitsPerOrder": self.per_order(d.commits as f64),
            })).collect::<Vec<_>>(),
        })
    }

    /// `per confirmed order: 5.2 statements, 1.1 commits (order 3.0/0.6, …)`.
    pub fn text(&self) -> String {
        let (s, c, e) = self.totals();
        let f = |x: Option<f64>| x.map_or("?".to_owned(), |v| format!("{v:.2}"));
        let each: Vec<String> = self
            .shares
            .iter()
            .map(|d| {
                format!(
                    "{} {}/{}",
                    d.owner,
                    f(self.per_order(d.statements as f64)),
                    f(self.per_order(d.commits as f64))
                )
            })
            .collect();
        format!(
            "per {} order ({} orders): {} statements, {} commits, {} ms executing (statements/commits: {})",
            self.per,
            self.orders,
            f(self.per_order(s as f64)),
            f(self.per_order(c as f64)),
            f(self.per_order(e)),
            each.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn reading(pairs: &[(&str, i64)]) -> Counters {
        let mut m: BTreeMap<String, i64> =
            pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        m.insert(STATEMENTS_AVAILABLE.to_owned(), 1);
        Counters(m)
    }

    #[test]
    fn the_benchs_own_reads_are_left_out_and_the_work_is_divided_by_the_orders() {
        let before = reading(&[
            ("pgss/orders/calls", 100),
            ("pgss/orders/exec_us", 5_000),
            ("pgss_probe/orders/calls", 10),
            ("pgdb/orders/xact_commit", 50),
            ("pgss/stock/calls", 7),
            ("pgdb/stock/xact_commit", 7),
        ]);
        let after = reading(&[
            ("pgss/orders/calls", 300),
            ("pgss/orders/exec_us", 9_000),
            ("pgss_probe/orders/calls", 40),
            ("pgdb/orders/xact_commit", 130),
            ("pgss/stock/calls", 107),
            ("pgdb/stock/xact_commit", 57),
        ]);
        let dbs = [
            ("order".to_owned(), "orders".to_owned()),
            ("product-stock".to_owned(), "stock".to_owned()),
        ];
        let w = between(&before, &after, &dbs, "confirmed", 50).unwrap();
        // 80 commits in the order database, 30 of them the bench's own reads.
        assert_eq!(w.shares[0].commits, 50);
        assert_eq!(w.shares[0].statements, 200);
        assert!((w.shares[0].exec_ms - 4.0).abs() < 1e-9);
        assert_eq!(w.totals(), (300, 100, 4.0));
        let v = w.to_json();
        assert_eq!(v["statementsPerOrder"], 6.0);
        assert_eq!(v["commitsPerOrder"], 2.0);
        assert!(
            w.text().contains("6.00 statements, 2.00 commits"),
            "{}",
            w.text()
        );
        // Without pg_stat_statements nothing is claimed.
        let mut bare = after.clone();
        bare.0.remove(STATEMENTS_AVAILABLE);
        assert_eq!(between(&before, &bare, &dbs, "confirmed", 50), None);
        // No order: no ratio.
        let none = between(&before, &after, &dbs, "confirmed", 0).unwrap();
        assert_eq!(none.to_json()["statementsPerOrder"], Value::Null);
    }
}
