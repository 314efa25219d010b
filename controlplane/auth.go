package controlplane

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirhq/weir/controlplane/people"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// tokenInterceptor admits LeaseService calls with the data-plane token and
// every other call with the admin token, as the admin role; or with a
// person's OpenID ID token, as their role (person); or in process with the
// principal the dashboard's session put in the context (no network
// request can carry a context value). Neither token opens the
// other's services: a leaked worker token cannot read or change the pool.
// A refused call is counted by service, never written to the audit log.
type tokenInterceptor struct {
	admin, dataplane []byte
	refused          *prometheus.CounterVec
	// person finds the principal of a bearer token that is not the admin
	// token: a person's ID token (Server.personOf).
	person func(ctx context.Context, token string) (principal, bool)
}

var errUnauthenticated = errors.New("missing or invalid bearer token")

func isLeaseProcedure(procedure string) bool {
	return strings.HasPrefix(procedure, "/"+weirv1connect.LeaseServiceName+"/")
}

// authenticate returns ctx with the call's principal (admin calls).
func (t tokenInterceptor) authenticate(ctx context.Context, procedure string, header http.Header) (context.Context, error) {
	lease := isLeaseProcedure(procedure)
	if _, ok := principalOf(ctx); ok && !lease {
		return ctx, nil
	}
	want := t.admin
	if lease {
		want = t.dataplane
	}
	token, ok := strings.CutPrefix(header.Get("Authorization"), "Bearer ")
	if ok && !lease && t.person != nil && subtle.ConstantTimeCompare([]byte(token), want) != 1 {
		if p, ok := t.person(ctx, token); ok {
			return withPrincipal(ctx, p), nil
		}
	}
	if !ok || subtle.ConstantTimeCompare([]byte(token), want) != 1 {
		if t.refused != nil {
			service, _, _ := strings.Cut(strings.TrimPrefix(procedure, "/"), "/")
			t.refused.WithLabelValues(service).Inc()
		}
		return ctx, connect.NewError(connect.CodeUnauthenticated, errUnauthenticated)
	}
	if lease {
		return ctx, nil
	}
	return withPrincipal(ctx, principal{name: cleanActor(header.Get(ActorHeader)), credential: people.CredentialAdminToken, role: people.Admin}), nil
}

func (t tokenInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := t.authenticate(ctx, req.Spec().Procedure, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (t tokenInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (t tokenInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := t.authenticate(ctx, conn.Spec().Procedure, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// personOf is the principal of an ID token from the OpenID provider, with
// the role the mapping gives its email; false for anything else. Only a
// token shaped like a JWT is tried: a mistyped admin token costs no call
// to the provider.
func (s *Server) personOf(ctx context.Context, token string) (principal, bool) {
	if s.oidc == nil || strings.Count(token, ".") != 2 {
		return principal{}, false
	}
	email, err := s.oidc.VerifyBearer(ctx, token, s.now)
	if err != nil {
		s.log.DebugContext(ctx, "oidc bearer refused", "err", err)
		return principal{}, false
	}
	role := s.cfg.oidcRoles.RoleOf(email)
	if role == people.None {
		return principal{}, false
	}
	return principal{name: email, credential: people.CredentialOIDC, role: role}, true
}

var errNoClientCert = errors.New("LeaseService needs a client certificate (mTLS)")

// requireClientCert admits only requests whose TLS client certificate the
// server verified (Config.LeaseClientCert). The TLS layer verifies a
// certificate when one is given and lets calls without one through, so
// operators' calls need none; this is where LeaseService insists.
func requireClientCert(next http.Handler) http.Handler {
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			ew.Write(w, r, connect.NewError(connect.CodeUnauthenticated, errNoClientCert)) //nolint:errcheck // the client went away
			return
		}
		next.ServeHTTP(w, r)
	})
}
