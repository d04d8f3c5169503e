//! The provider's side: payments and refunds in memory, the merchant's API (API key checked),
//! and the buyer's checkout, which succeeds the payment and hands its notifications to the
//! notifier.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use flashsale_contract::payment::check_currency;
use flashsale_platform::ApiError;
use flashsale_proto::payment::v1::{
    CreatePaymentRequest, CreatePaymentResponse, GetPaymentRequest, GetPaymentResponse,
    PayCheckoutRequest, PayCheckoutResponse, Payment, PaymentStatus, RefundPaymentRequest,
    RefundPaymentResponse, payment_provider_service_server::PaymentProviderService,
};
use tonic::{Request, Response, Status};

use crate::{
    SimConfig,
    notify::{Notifier, TraceHeaders},
};

/// Longest merchant reference, refund id and payment id accepted.
const ID_MAX_LEN: usize = 64;

#[derive(Default)]
struct State {
    payments: HashMap<String, Payment>,
    /// Payment id by merchant reference (CreatePayment's idempotency).
    by_reference: HashMap<String, String>,
    notify_urls: HashMap<String, String>,
    /// The W3C trace context headers CreatePayment came with, per payment: its notifications
    /// carry them, so the merchant's handling of them continues the trace that created it.
    traces: HashMap<String, TraceHeaders>,
    /// Per refund id: its payment, calls so far, and whether it was paid.
    refunds: HashMap<String, (String, u32, bool)>,
}

/// The simulated provider. Cheap to clone.
#[derive(Clone)]
pub struct Simulator {
    config: Arc<SimConfig>,
    public_url: String,
    state: Arc<Mutex<State>>,
    notifier: Notifier,
}

impl Simulator {
    pub fn new(config: SimConfig, port: u16) -> Self {
        let public_url = if config.public_url.is_empty() {
            format!("http://127.0.0.1:{port}")
        } else {
            config.public_url.trim_end_matches('/').to_owned()
        };
        let config = Arc::new(config);
        Self {
            notifier: Notifier::new(config.clone()),
            config,
            public_url,
            state: Arc::default(),
        }
    }

    /// What the notifier did so far.
    pub fn stats(&self) -> crate::Stats {
        self.notifier.stats()
    }

    /// A payment as the simulator holds it.
    pub fn payment(&self, payment_id: &str) -> Option<Payment> {
        self.state.lock().ok()?.payments.get(payment_id).cloned()
    }

    /// RefundPayment calls made so far with `refund_id` (replays and declined ones included).
    pub fn refund_calls(&self, refund_id: &str) -> u32 {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.refunds.get(refund_id).map(|r| r.1))
            .unwrap_or(0)
    }

    fn merchant<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let presented = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match presented {
            Some(key) if key == self.config.api_key => Ok(()),
            Some(_) => Err(ApiError::Unauthenticated("wrong API key".into()).into()),
            None => Err(ApiError::Unauthenticated(
                "missing `authorization: Bearer <API key>`".into(),
            )
            .into()),
        }
    }

    fn state(&self) -> Result<std::sync::MutexGuard<'_, State>, Status> {
        self.state
            .lock()
            .map_err(|_| Status::internal("simulator state poisoned"))
    }
}

fn check_id(bad: &mut Vec<(String, String)>, field: &str, value: &str) {
    if value.is_empty() || value.chars().count() > ID_MAX_LEN {
        bad.push((
            field.to_owned(),
            format!("must be 1..={ID_MAX_LEN} characters"),
        ));
    }
}

fn invalid(bad: Vec<(String, String)>) -> Result<(), Status> {
    if bad.is_empty() {
        Ok(())
    } else {
        Err(ApiError::InvalidArgument(bad).into())
    }
}

#[tonic::async_trait]
impl PaymentProviderService for Simulator {
    async fn create_payment(
        &self,
        req: Request<CreatePaymentRequest>,
    ) -> Result<Response<CreatePaymentResponse>, Status> {
        self.merchant(&req)?;
        let trace = crate::notify::trace_headers(req.metadata());
        let r = req.into_inner();
        let mut bad = Vec::new();
        check_id(&mut bad, "merchant_reference", &r.merchant_reference);
        if r.amount_cents < 0 {
            bad.push(("amount_cents".into(), "must not be negative".into()));
        }
        if let Err(why) = check_currency(&r.currency) {
            bad.push(("currency".into(), why.into()));
        }
        let url_ok = (r.notify_url.starts_with("http://") || r.notify_url.starts_with("https://"))
            && tonic::transport::Endpoint::from_shared(r.notify_url.clone()).is_ok();
        if !url_ok {
            bad.push(("notify_url".into(), "must be an http(s) URL".into()));
        }
        invalid(bad)?;
        let mut state = self.state()?;
        if let Some(id) = state.by_reference.get(&r.merchant_reference).cloned() {
            let p = state.payments.get(&id).cloned().unwrap_or_default();
            if p.amount_cents != r.amount_cents || p.currency != r.currency {
                return Err(ApiError::failed_precondition(
                    flashsale_contract::reason::IDEMPOTENCY_KEY_REUSED,
                    "merchant_reference was used before with another amount or currency",
                )
                .into());
            }
            return Ok(Response::new(CreatePaymentResponse {
                payment: Some(p),
                replayed: true,
            }));
        }
        let id = format!("pay_{}", uuid::Uuid::new_v4().simple());
        let payment = Payment {
            payment_id: id.clone(),
            merchant_reference: r.merchant_reference.clone(),
            amount_cents: r.amount_cents,
            currency: r.currency,
            status: PaymentStatus::Pending as i32,
            checkout_url: format!("{}/checkout/{id}", self.public_url),
        };
        state.by_reference.insert(r.merchant_reference, id.clone());
        state.notify_urls.insert(id.clone(), r.notify_url);
        state.traces.insert(id.clone(), trace);
        state.payments.insert(id, payment.clone());
        tracing::info!(payment_id = %payment.payment_id, reference = %payment.merchant_reference, "payment created");
        Ok(Response::new(CreatePaymentResponse {
            payment: Some(payment),
            replayed: false,
        }))
    }

    async fn refund_payment(
        &self,
        req: Request<RefundPaymentRequest>,
    ) -> Result<Response<RefundPaymentResponse>, Status> {
        self.merchant(&req)?;
        let r = req.into_inner();
        let mut bad = Vec::new();
        check_id(&mut bad, "payment_id", &r.payment_id);
        check_id(&mut bad, "refund_id", &r.refund_id);
        invalid(bad)?;
        if !self.config.refund_delay.is_zero() {
            tokio::time::sleep(self.config.refund_delay).await;
        }
        let mut state = self.state()?;
        let Some(payment) = state.payments.get(&r.payment_id).cloned() else {
            return Err(ApiError::NotFound(format!("no payment {}", r.payment_id)).into());
        };
        if r.amount_cents != payment.amount_cents || r.currency != payment.currency {
            return Err(ApiError::invalid(
                "amount_cents",
                format!(
                    "a refund pays back the whole payment: {} {}",
                    payment.amount_cents, payment.currency
                ),
            )
            .into());
        }
        let (of, calls, paid) = state
            .refunds
            .entry(r.refund_id.clone())
            .or_insert_with(|| (r.payment_id.clone(), 0, false));
        if *of != r.payment_id {
            return Err(ApiError::failed_precondition(
                flashsale_contract::reason::IDEMPOTENCY_KEY_REUSED,
                "refund_id was used before for another payment",
            )
            .into());
        }
        *calls = calls.saturating_add(1);
        if *paid {
            return Ok(Response::new(RefundPaymentResponse {
                refund_id: r.refund_id,
                payment: Some(payment),
                replayed: true,
            }));
        }
        if payment.status == PaymentStatus::Pending as i32 {
            return Err(ApiError::failed_precondition(
                "PAYMENT_NOT_CAPTURED",
                "the payment has not succeeded: nothing to refund",
            )
            .into());
        }
        if *calls <= self.config.refund_failures {
            let calls = *calls;
            tracing::info!(refund_id = %r.refund_id, calls, "refund declined (simulated)");
            return Err(ApiError::failed_precondition(
                "REFUND_DECLINED",
                format!("refund declined by the simulated provider (call {calls})"),
            )
            .into());
        }
        *paid = true;
        let payment = state
            .payments
            .get_mut(&r.payment_id)
            .map(|p| {
                p.status = PaymentStatus::Refunded as i32;
                p.clone()
            })
            .unwrap_or(payment);
        tracing::info!(refund_id = %r.refund_id, payment_id = %r.payment_id, "refund paid");
        Ok(Response::new(RefundPaymentResponse {
            refund_id: r.refund_id,
            payment: Some(payment),
            replayed: false,
        }))
    }

    async fn pay_checkout(
        &self,
        req: Request<PayCheckoutRequest>,
    ) -> Result<Response<PayCheckoutResponse>, Status> {
        let r = req.into_inner();
        let mut bad = Vec::new();
        check_id(&mut bad, "payment_id", &r.payment_id);
        invalid(bad)?;
        let (payment, notify_url, trace, first) = {
            let mut state = self.state()?;
            let url = state.notify_urls.get(&r.payment_id).cloned();
            let trace = state.traces.get(&r.payment_id).cloned().unwrap_or_default();
            let Some(p) = state.payments.get_mut(&r.payment_id) else {
                return Err(ApiError::NotFound(format!("no payment {}", r.payment_id)).into());
            };
            let first = p.status == PaymentStatus::Pending as i32;
            if first {
                p.status = PaymentStatus::Succeeded as i32;
            }
            (p.clone(), url.unwrap_or_default(), trace, first)
        };
        if first {
            tracing::info!(payment_id = %payment.payment_id, "buyer paid");
            self.notifier
                .payment_succeeded(&payment, &notify_url, trace);
        }
        Ok(Response::new(PayCheckoutResponse {
            payment: Some(payment),
        }))
    }

    async fn get_payment(
        &self,
        req: Request<GetPaymentRequest>,
    ) -> Result<Response<GetPaymentResponse>, Status> {
        self.merchant(&req)?;
        let r = req.into_inner();
        let mut bad = Vec::new();
        check_id(&mut bad, "payment_id", &r.payment_id);
        invalid(bad)?;
        let payment = self.state()?.payments.get(&r.payment_id).cloned();
        match payment {
            Some(p) => Ok(Response::new(GetPaymentResponse { payment: Some(p) })),
            None => Err(ApiError::NotFound(format!("no payment {}", r.payment_id)).into()),
        }
    }
}
