//! The payment side of the API: `flashsale.order.v1.PaymentNotificationService` (the provider's
//! signed notifications — authenticated by their signature, not by a token), ListRefunds and
//! RetryRefund.

use flashsale_contract::to_timestamp;
use flashsale_proto::order::v1::{
    self as pb, ListRefundsRequest, ListRefundsResponse, NotifyPaymentRequest,
    NotifyPaymentResponse, RetryRefundRequest, RetryRefundResponse,
    payment_notification_service_server::PaymentNotificationService,
};
use tonic::{Request, Response, Status};

use super::grpc::{ADMIN, authorize, status};
use crate::{
    app::{NotifyBatcher, Refunds, SignedNotice, reason_to_proto},
    domain::{OrderError, ProviderPayment, RefundRecord, RefundState, parse_order_id},
};

/// The provider's way in. Served without the bearer-token interceptor: a provider holds no
/// flashsale token, and a buyer's token must not count; the HMAC does.
#[derive(Clone)]
pub struct PaymentNotifications {
    notices: NotifyBatcher,
}

impl PaymentNotifications {
    /// Notifications go through `notices`, which applies those arriving at the same moment
    /// together.
    pub fn new(notices: NotifyBatcher) -> Self {
        Self { notices }
    }
}

#[tonic::async_trait]
impl PaymentNotificationService for PaymentNotifications {
    async fn notify_payment(
        &self,
        req: Request<NotifyPaymentRequest>,
    ) -> Result<Response<NotifyPaymentResponse>, Status> {
        let r = req.into_inner();
        let notice = SignedNotice {
            payload: r.payload,
            signature: r.signature,
            timestamp: r.timestamp,
            trace: flashsale_messaging::outbox::current_trace(),
        };
        let applied = match self.notices.call(notice).await {
            Ok(answer) => answer,
            Err(e) => Err(OrderError::Internal(anyhow::Error::new(e))),
        }
        .map_err(status)?;
        Ok(Response::new(NotifyPaymentResponse {
            duplicate: applied.duplicate,
            order_id: applied.order_id.to_string(),
        }))
    }
}

pub(super) fn refund_status(s: RefundState) -> pb::RefundStatus {
    match s {
        RefundState::Requested => pb::RefundStatus::Recorded,
        RefundState::Succeeded => pb::RefundStatus::Completed,
        RefundState::Failed => pb::RefundStatus::Failed,
    }
}

pub(super) fn checkout_to_proto(p: ProviderPayment) -> pb::PaymentCheckout {
    pb::PaymentCheckout {
        provider_payment_id: p.provider_payment_id,
        checkout_url: p.checkout_url,
        amount_cents: p.amount_cents,
        currency: p.currency,
    }
}

fn refund_to_proto(r: RefundRecord) -> pb::Refund {
    pb::Refund {
        order_id: r.order_id.to_string(),
        payment_id: r.payment_id,
        amount_cents: r.amount_cents,
        currency: r.currency,
        reason: r.reason.map_or(0, |c| reason_to_proto(c) as i32),
        status: refund_status(r.state) as i32,
        attempts: r.attempts,
        last_error: r.last_error,
        next_attempt_time: (r.state == RefundState::Requested)
            .then(|| to_timestamp(r.next_attempt_at)),
        create_time: Some(to_timestamp(r.created_at)),
        update_time: Some(to_timestamp(r.updated_at)),
    }
}

fn refund_filter(raw: i32) -> Result<Option<RefundState>, OrderError> {
    match pb::RefundStatus::try_from(raw) {
        Ok(pb::RefundStatus::Unspecified) => Ok(None),
        Ok(pb::RefundStatus::Recorded) => Ok(Some(RefundState::Requested)),
        Ok(pb::RefundStatus::Completed) => Ok(Some(RefundState::Succeeded)),
        Ok(pb::RefundStatus::Failed) => Ok(Some(RefundState::Failed)),
        Ok(pb::RefundStatus::None) | Err(_) => Err(OrderError::invalid(
            "status",
            "must be UNSPECIFIED, RECORDED, COMPLETED or FAILED",
        )),
    }
}

/// ListRefunds (admin).
pub(super) async fn list_refunds(
    refunds: &Refunds,
    req: Request<ListRefundsRequest>,
) -> Result<Response<ListRefundsResponse>, Status> {
    let caller = authorize(&req, ADMIN)?;
    let r = req.into_inner();
    let state = refund_filter(r.status).map_err(status)?;
    let page = refunds
        .list(state, r.page_size, &r.page_token)
        .await
        .map_err(status)?;
    tracing::info!(who = %caller.subject, listed = page.refunds.len(), "refunds listed");
    Ok(Response::new(ListRefundsResponse {
        refunds: page.refunds.into_iter().map(refund_to_proto).collect(),
        next_page_token: page.next_page_token,
    }))
}

/// RetryRefund (admin).
pub(super) async fn retry_refund(
    refunds: &Refunds,
    req: Request<RetryRefundRequest>,
) -> Result<Response<RetryRefundResponse>, Status> {
    let caller = authorize(&req, ADMIN)?;
    let id = parse_order_id(&req.get_ref().order_id).map_err(status)?;
    let refund = refunds.retry(id).await.map_err(status)?;
    tracing::info!(who = %caller.subject, order_id = %id, "refund retried by hand");
    Ok(Response::new(RetryRefundResponse {
        refund: Some(refund_to_proto(refund)),
    }))
}
