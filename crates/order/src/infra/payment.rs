//! The payment provider over gRPC (`flashsale.payment.v1.PaymentProviderService`, which
//! `flashsale-payment-sim` serves): the adapter behind [`PaymentProvider`]. Every call carries
//! the merchant's API key and the current trace context, and has `payment.call_timeout_ms`.

use std::time::Duration;

use flashsale_contract::to_timestamp;
use flashsale_proto::payment::v1::{
    CreatePaymentRequest, GetPaymentRequest, PaymentStatus, RefundPaymentRequest,
    payment_provider_service_client::PaymentProviderServiceClient,
};
use tonic::{Code, metadata::MetadataValue, transport::Channel};

use crate::{
    config::PaymentSettings,
    domain::{
        NewPayment, PaymentAtProvider, PaymentAtProviderState, PaymentProvider, ProviderError,
        ProviderPayment, RefundCall,
    },
};

/// The provider at `payment.provider_url`.
#[derive(Clone)]
pub struct GrpcPaymentProvider {
    client: PaymentProviderServiceClient<Channel>,
    bearer: MetadataValue<tonic::metadata::Ascii>,
}

impl GrpcPaymentProvider {
    /// A client that connects on first use (the service starts while the provider is down).
    pub fn new(settings: &PaymentSettings) -> anyhow::Result<Self> {
        let channel = flashsale_platform::grpc::lazy_channel(
            &settings.provider_url,
            Duration::from_millis(settings.call_timeout_ms),
            // The provider is outside the platform: an `https://` URL is checked against the
            // system's roots, with no client certificate of the platform's.
            &flashsale_platform::tls::GrpcTlsSettings::default(),
        )?;
        let bearer = format!("Bearer {}", settings.api_key)
            .parse()
            .map_err(|_| anyhow::anyhow!("payment.api_key is not valid as gRPC metadata"))?;
        Ok(Self {
            client: PaymentProviderServiceClient::new(channel),
            bearer,
        })
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(message);
        req.metadata_mut()
            .insert("authorization", self.bearer.clone());
        flashsale_platform::trace::inject_current(req.metadata_mut());
        req
    }
}

/// A refusal is the provider's answer; anything else leaves the outcome unknown.
fn provider_error(s: &tonic::Status) -> ProviderError {
    let why = match flashsale_platform::error::reason_of(s) {
        Some(reason) => format!("{:?} {reason}: {}", s.code(), s.message()),
        None => format!("{:?}: {}", s.code(), s.message()),
    };
    match s.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::Internal
        | Code::ResourceExhausted
        | Code::Aborted => ProviderError::Unavailable(why),
        _ => ProviderError::Refused(why),
    }
}

#[async_trait::async_trait]
impl PaymentProvider for GrpcPaymentProvider {
    async fn create_payment(&self, p: &NewPayment) -> Result<ProviderPayment, ProviderError> {
        let msg = CreatePaymentRequest {
            merchant_reference: p.order_id.to_string(),
            amount_cents: p.amount_cents,
            currency: p.currency.clone(),
            notify_url: p.notify_url.clone(),
            expire_time: Some(to_timestamp(p.expires_at)),
        };
        let resp = self
            .client
            .clone()
            .create_payment(self.request(msg))
            .await
            .map_err(|s| provider_error(&s))?
            .into_inner();
        let payment = resp.payment.ok_or_else(|| {
            ProviderError::Unavailable("CreatePayment answered no payment".into())
        })?;
        if payment.merchant_reference != p.order_id.to_string() || payment.payment_id.is_empty() {
            return Err(ProviderError::Refused(format!(
                "CreatePayment answered payment `{}` for reference `{}`",
                payment.payment_id, payment.merchant_reference
            )));
        }
        Ok(ProviderPayment {
            provider_payment_id: payment.payment_id,
            checkout_url: payment.checkout_url,
            amount_cents: payment.amount_cents,
            currency: payment.currency,
        })
    }

    async fn refund(&self, r: &RefundCall) -> Result<(), ProviderError> {
        let msg = RefundPaymentRequest {
            payment_id: r.provider_payment_id.clone(),
            refund_id: r.refund_id.clone(),
            amount_cents: r.amount_cents,
            currency: r.currency.clone(),
        };
        self.client
            .clone()
            .refund_payment(self.request(msg))
            .await
            .map(drop)
            .map_err(|s| provider_error(&s))
    }

    async fn payment(&self, provider_payment_id: &str) -> Result<PaymentAtProvider, ProviderError> {
        let msg = GetPaymentRequest {
            payment_id: provider_payment_id.to_owned(),
        };
        let payment = self
            .client
            .clone()
            .get_payment(self.request(msg))
            .await
            .map_err(|s| provider_error(&s))?
            .into_inner()
            .payment
            .ok_or_else(|| ProviderError::Unavailable("GetPayment answered no payment".into()))?;
        if payment.payment_id != provider_payment_id {
            return Err(ProviderError::Refused(format!(
                "GetPayment for `{provider_payment_id}` answered payment `{}`",
                payment.payment_id
            )));
        }
        let state = match PaymentStatus::try_from(payment.status) {
            Ok(PaymentStatus::Pending) => PaymentAtProviderState::Pending,
            Ok(PaymentStatus::Succeeded) => PaymentAtProviderState::Succeeded,
            Ok(PaymentStatus::Refunded) => PaymentAtProviderState::Refunded,
            _ => PaymentAtProviderState::Other,
        };
        Ok(PaymentAtProvider {
            provider_payment_id: payment.payment_id,
            merchant_reference: payment.merchant_reference,
            amount_cents: payment.amount_cents,
            currency: payment.currency,
            state,
        })
    }
}
