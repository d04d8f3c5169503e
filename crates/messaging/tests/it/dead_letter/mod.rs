//! The dead-letter drainer and admin against the real broker and database. Each test has its
//! own exchange, queues (deleted on drop) and database with the `dead_letters` migration.

mod admin;
mod drainer;
mod timeline;
mod validation;

use flashsale_messaging::{
    DeadLetterAdmin, DeadLetterDrainer, OutgoingMessage, Publisher, QueueTopology,
    dead_letter::count_parked,
    headers,
    migration::{
        AddCorrelation, AddDeadLetterCorrelation, CreateDeadLetters, CreateOutboxAndInbox,
    },
};
use flashsale_platform::auth::{Caller, Role};
use flashsale_proto::events::v1::Envelope;
use flashsale_test_support::{TestDatabase, eventually};
use lapin::types::{AMQPValue, FieldTable};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use sea_orm_migration::{MigrationTrait, MigratorTrait};

use crate::helpers::{Amqp, Running, WAIT, config};

struct Migrator;

impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(CreateOutboxAndInbox),
            Box::new(CreateDeadLetters),
            Box::new(AddCorrelation),
            Box::new(AddDeadLetterCorrelation),
        ]
    }
}

pub const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// A test's broker, database and the consumer queues it plays with.
pub struct Env {
    pub amqp: Amqp,
    pub db: DatabaseConnection,
    pub topologies: Vec<QueueTopology>,
    _tdb: TestDatabase,
}

impl Env {
    /// Unique exchange and queues named `names` (bound to `order.created`), and a fresh,
    /// migrated database.
    pub async fn new(names: &[&str]) -> Self {
        let amqp = Amqp::new(config()).await;
        let mut topologies = Vec::new();
        for name in names {
            topologies.push(amqp.topology(name, &["order.created"]).await);
        }
        let tdb = TestDatabase::create().await.unwrap();
        let db = tdb.connect().await.unwrap();
        Migrator::up(&db, None).await.unwrap();
        Self {
            amqp,
            db,
            topologies,
            _tdb: tdb,
        }
    }

    pub fn topology(&self, i: usize) -> &QueueTopology {
        &self.topologies[i]
    }

    pub fn queue(&self, i: usize) -> String {
        self.topologies[i].queue().to_owned()
    }

    pub fn admin(&self) -> DeadLetterAdmin {
        DeadLetterAdmin::new(
            &self.db,
            Publisher::new(&self.amqp.broker),
            &self.topologies,
        )
        .unwrap()
    }

    pub fn drainer(&self) -> Running {
        let drainer =
            DeadLetterDrainer::new(&self.amqp.broker, &self.db, &self.topologies).unwrap();
        Running::spawn(|s| drainer.run(s))
    }

    /// Puts `env` into queue `i`'s parking lot the way the consumer parks a message.
    pub async fn park(&self, i: usize, env: &Envelope, parked_at_ms: i64, error: &str) {
        let t = self.topology(i);
        let mut h = FieldTable::default();
        let s = |v: &str| AMQPValue::LongString(v.into());
        h.insert(headers::ERROR.into(), s(error));
        h.insert(headers::ATTEMPT.into(), AMQPValue::LongLongInt(5));
        h.insert(headers::ORIGINAL_ROUTING_KEY.into(), s(&env.r#type));
        h.insert(headers::ORIGINAL_QUEUE.into(), s(t.queue()));
        h.insert(
            headers::PARKED_AT_MS.into(),
            AMQPValue::LongLongInt(parked_at_ms),
        );
        h.insert("traceparent".into(), s(TRACEPARENT));
        let msg = OutgoingMessage {
            exchange: String::new(),
            routing_key: t.dead_letter_queue(),
            message_id: env.message_id.clone(),
            kind: env.r#type.clone(),
            timestamp: 0,
            headers: h,
            payload: flashsale_messaging::envelope::encode(env),
            content_type: String::new(),
        };
        Publisher::new(&self.amqp.broker)
            .publish(&msg)
            .await
            .unwrap();
    }

    /// Waits until queue `i` has `n` parked rows.
    pub async fn wait_parked(&self, i: usize, n: i64) {
        let queue = self.queue(i);
        eventually(WAIT, &format!("{n} parked rows of {queue}"), || async {
            (count_parked(&self.db, &queue).await.unwrap() == n).then_some(())
        })
        .await
        .unwrap();
    }

    /// The stored row of `message_id` in queue `i` (the latest, if parked several times).
    pub async fn row(&self, i: usize, message_id: &str) -> Row {
        let r = self
            .db
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT message_id::text AS message_id, routing_key, message_type, error, attempts, \
                        payload, headers::text AS headers, state, resolved_by, resolved_reason \
                 FROM dead_letters WHERE queue = $1 AND message_id::text = $2 \
                 ORDER BY id DESC LIMIT 1",
                [self.queue(i).into(), message_id.into()],
            ))
            .await
            .unwrap()
            .expect("a stored row");
        Row {
            message_id: r.try_get("", "message_id").unwrap(),
            routing_key: r.try_get("", "routing_key").unwrap(),
            message_type: r.try_get("", "message_type").unwrap(),
            error: r.try_get("", "error").unwrap(),
            attempts: r.try_get("", "attempts").unwrap(),
            payload: r.try_get("", "payload").unwrap(),
            headers: serde_json::from_str(&r.try_get::<String>("", "headers").unwrap()).unwrap(),
            state: r.try_get("", "state").unwrap(),
            resolved_by: r.try_get("", "resolved_by").unwrap(),
            resolved_reason: r.try_get("", "resolved_reason").unwrap(),
        }
    }

    /// Every stored row of queue `i`, any state.
    pub async fn row_count(&self, i: usize) -> i64 {
        self.db
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT count(*) AS n FROM dead_letters WHERE queue = $1",
                [self.queue(i).into()],
            ))
            .await
            .unwrap()
            .unwrap()
            .try_get("", "n")
            .unwrap()
    }
}

#[derive(Debug)]
pub struct Row {
    pub message_id: String,
    pub routing_key: String,
    pub message_type: String,
    pub error: String,
    pub attempts: i32,
    pub payload: Vec<u8>,
    pub headers: serde_json::Value,
    pub state: String,
    pub resolved_by: Option<String>,
    pub resolved_reason: Option<String>,
}

/// `msg` as sent by a verified caller with `role`.
pub fn as_role<T>(role: Role, msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.extensions_mut().insert(Caller {
        subject: format!("it-{role}"),
        role,
    });
    req
}

/// `msg` as sent by an admin (`it-admin`).
pub fn as_admin<T>(msg: T) -> tonic::Request<T> {
    as_role(Role::Admin, msg)
}

/// Milliseconds since the epoch, `offset_s` seconds from a fixed base.
pub fn at(offset_s: i64) -> i64 {
    1_767_225_600_000 + offset_s * 1000
}
