//! The dead-letter admin API every service serves (`flashsale.admin.v1.DeadLetterService`).
//! Admin only. Until the parking-lot store is wired in, every call is answered `UNIMPLEMENTED`
//! after authorisation, so clients see the contract and the right auth errors already.

use flashsale_proto::admin::v1::{
    DiscardDeadLettersRequest, DiscardDeadLettersResponse, ListDeadLettersRequest,
    ListDeadLettersResponse, ReplayDeadLettersRequest, ReplayDeadLettersResponse,
    dead_letter_service_server::DeadLetterService,
};
use tonic::{Request, Response, Status};

use crate::{auth::Role, grpc::not_yet};

/// Answers every dead-letter RPC `UNIMPLEMENTED` (after the admin check).
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingDeadLetters;

fn admin_then_unimplemented<T>(req: &Request<T>, rpc: &str) -> Status {
    not_yet(req, &[Role::Admin], rpc)
}

#[tonic::async_trait]
impl DeadLetterService for PendingDeadLetters {
    async fn list_dead_letters(
        &self,
        req: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        Err(admin_then_unimplemented(&req, "ListDeadLetters"))
    }

    async fn replay_dead_letters(
        &self,
        req: Request<ReplayDeadLettersRequest>,
    ) -> Result<Response<ReplayDeadLettersResponse>, Status> {
        Err(admin_then_unimplemented(&req, "ReplayDeadLetters"))
    }

    async fn discard_dead_letters(
        &self,
        req: Request<DiscardDeadLettersRequest>,
    ) -> Result<Response<DiscardDeadLettersResponse>, Status> {
        Err(admin_then_unimplemented(&req, "DiscardDeadLetters"))
    }
}
