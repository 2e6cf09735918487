"""The ``Sasl`` gRPC service: SCRAM over gRPC, on every broker listener and on the
controller (``broker.security.grpc_sessions`` holds the exchanges and tokens).

SaslHandshake takes only a SCRAM mechanism this server enables, or any SCRAM mechanism
where none is enabled (PLAIN needs no exchange: where it is enabled, or none is, its
password travels in each call's metadata); anything else is UNSUPPORTED_SASL_MECHANISM
with the enabled list. A failed SaslAuthenticate
(unknown user, wrong proof, malformed message, an unknown exchange) is answered
SASL_AUTHENTICATION_FAILED ``connection.failed.authentication.delay.ms`` late, as on the
Kafka listener (KIP-306). The session token travels only in the final answer and is
never logged.
"""

from __future__ import annotations

import logging

import grpc

from tidewater.broker.clock import mono_ms
from tidewater.broker.security.settings import BrokerSecurity
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.scram import MECHANISMS, SaslAuthenticationError

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext


class SaslServicer(pb_grpc.SaslServicer):
    def __init__(self, security: BrokerSecurity) -> None:
        self.security = security

    async def SaslHandshake(self, request: pb.GrpcSaslHandshakeRequest,
                            context: Context[pb.GrpcSaslHandshakeRequest,
                                             pb.GrpcSaslHandshakeResponse]
                            ) -> pb.GrpcSaslHandshakeResponse:
        # No mechanism enabled (SASL off on the Kafka listeners): gRPC calls may still name
        # a user the metadata knows, as PLAIN metadata could before, so every SCRAM
        # mechanism is taken (an authorizer then checks that user's ACLs).
        enabled = list(self.security.settings.sasl_mechanisms) or list(MECHANISMS)
        if request.mechanism not in enabled or request.mechanism not in MECHANISMS:
            return pb.GrpcSaslHandshakeResponse(
                error_code=pb.UNSUPPORTED_SASL_MECHANISM, enabled_mechanisms=enabled,
                error_message=f"{request.mechanism!r} is not an enabled SCRAM mechanism here")
        exchange_id = self.security.grpc_sessions.open(
            request.mechanism, mono_ms(), renews=request.previous_session_token)
        return pb.GrpcSaslHandshakeResponse(error_code=pb.NONE, enabled_mechanisms=enabled,
                                            exchange_id=exchange_id)

    async def SaslAuthenticate(self, request: pb.GrpcSaslAuthenticateRequest,
                               context: Context[pb.GrpcSaslAuthenticateRequest,
                                                pb.GrpcSaslAuthenticateResponse]
                               ) -> pb.GrpcSaslAuthenticateResponse:
        try:
            answer, issued, user = self.security.grpc_sessions.step(
                request.exchange_id, request.auth_bytes, mono_ms())
        except SaslAuthenticationError as e:
            log.info("gRPC SASL authentication from %s failed: %s", context.peer(), e)
            await self.security.failure_delay()
            return pb.GrpcSaslAuthenticateResponse(error_code=pb.SASL_AUTHENTICATION_FAILED,
                                                   error_message=str(e))
        if issued is None:
            return pb.GrpcSaslAuthenticateResponse(error_code=pb.NONE, auth_bytes=answer)
        log.info("gRPC client %s authenticated as User:%s (session of %d ms)",
                 context.peer(), user, issued.lifetime_ms)
        return pb.GrpcSaslAuthenticateResponse(error_code=pb.NONE, auth_bytes=answer,
                                               session_token=issued.token,
                                               session_lifetime_ms=issued.lifetime_ms)
