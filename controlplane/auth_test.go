package controlplane

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/rpcclient"
)

// protocols are the three wire protocols the one h2c port serves.
var protocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect", nil},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpcweb", []connect.ClientOption{connect.WithGRPCWeb()}},
}

// rawHeader sets an Authorization header verbatim, for malformed tokens.
type rawHeader string

func (h rawHeader) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(h))
		return next(ctx, req)
	}
}

func (h rawHeader) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(h))
		return conn
	}
}

func (h rawHeader) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func TestAuthInterceptor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("auth-key")

	// One cheap call per service; each reports only its error.
	calls := map[string]func(ctx context.Context, c clients) error{
		"AccountService.ListAccounts": func(ctx context.Context, c clients) error {
			_, err := c.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
			return err
		},
		"AccountService.CreateAccount": func(ctx context.Context, c clients) error {
			_, err := c.accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
				Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
				Label: "sneaky", Credential: "sk-ant-api03-not-a-real-key-000000",
			}))
			return err
		},
		"KeyService.ListKeys": func(ctx context.Context, c clients) error {
			_, err := c.keys.ListKeys(ctx, connect.NewRequest(&weirv1.ListKeysRequest{}))
			return err
		},
		"RouteService.ListRouteEvents": func(ctx context.Context, c clients) error {
			_, err := c.routes.ListRouteEvents(ctx, connect.NewRequest(&weirv1.ListRouteEventsRequest{}))
			return err
		},
		"LeaseService.VerifyKey": func(ctx context.Context, c clients) error {
			_, err := c.leases.VerifyKey(ctx, connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: keyHash}))
			return err
		},
		"LeaseService.Acquire": func(ctx context.Context, c clients) error {
			_, err := c.leases.Acquire(ctx, connect.NewRequest(&weirv1.AcquireRequest{KeyHash: keyHash, RequestId: "r"}))
			return err
		},
	}
	lease := map[string]bool{"LeaseService.VerifyKey": true, "LeaseService.Acquire": true}

	adminTok, dpTok := e.cfg.AdminToken, e.cfg.DataplaneToken
	headers := []struct {
		name   string
		header string // "" sends no Authorization header
		// okAdmin: the header opens the operator services; okLease: LeaseService.
		okAdmin, okLease bool
	}{
		{"no token", "", false, false},
		{"wrong token", "Bearer " + "x" + adminTok[1:], false, false},
		{"admin token", "Bearer " + adminTok, true, false},
		{"data-plane token", "Bearer " + dpTok, false, true},
		{"admin token without scheme", adminTok, false, false},
		{"lower-case scheme", "bearer " + adminTok, false, false},
		{"basic scheme", "Basic " + adminTok, false, false},
		{"admin token with suffix", "Bearer " + adminTok + "x", false, false},
		{"admin token prefix", "Bearer " + adminTok[:len(adminTok)-1], false, false},
		{"both tokens", "Bearer " + adminTok + dpTok, false, false},
	}
	for _, p := range protocols {
		for _, h := range headers {
			opts := append([]connect.ClientOption(nil), p.opts...)
			if h.header != "" {
				opts = append(opts, connect.WithInterceptors(rawHeader(h.header)))
			}
			c := e.clients("", opts...)
			for name, call := range calls {
				t.Run(p.name+"/"+h.name+"/"+name, func(t *testing.T) {
					ok := h.okAdmin
					if lease[name] {
						ok = h.okLease
					}
					err := call(t.Context(), c)
					if !ok {
						wantCode(t, err, connect.CodeUnauthenticated)
						return
					}
					if err != nil && connect.CodeOf(err) == connect.CodeUnauthenticated {
						t.Fatalf("right token rejected: %v", err)
					}
				})
			}
		}
	}
	// Rejected calls had no effect: the one account is the one the admin
	// token created (the other protocols' attempts conflicting on the
	// label), and the only leases are the data-plane token's, one per protocol.
	if n := e.count(`SELECT count(*) FROM accounts`); n != 1 {
		t.Errorf("accounts after the auth matrix: %d, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM leases`); n != len(protocols) {
		t.Errorf("leases after the auth matrix: %d, want %d", n, len(protocols))
	}
}

// TestAuthErrorLeaksNothing checks the rejection names neither token.
func TestAuthErrorLeaksNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.clients(e.cfg.DataplaneToken)
	_, err := c.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	ce := wantCode(t, err, connect.CodeUnauthenticated)
	for _, tok := range []string{e.cfg.AdminToken, e.cfg.DataplaneToken} {
		if strings.Contains(ce.Error(), tok) {
			t.Error("the auth error names a token")
		}
	}
}

// TestEveryServiceOverEveryProtocol drives each service through Connect,
// gRPC and gRPC-Web clients: the one h2c port must serve all three.
func TestEveryServiceOverEveryProtocol(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			admin := e.clients(e.cfg.AdminToken, p.opts...)
			dp := e.clients(e.cfg.DataplaneToken, p.opts...)
			ctx := t.Context()
			cred := apiKey()
			e.secrets.add(cred)

			created, err := admin.accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
				Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
				Label: "proto-" + p.name, Credential: cred, MaxConcurrency: 1,
			}))
			if err != nil {
				t.Fatalf("CreateAccount: %v", err)
			}
			requireAbsent(t, "CreateAccount", created.Msg, cred)
			list, err := admin.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
			if err != nil {
				t.Fatalf("ListAccounts: %v", err)
			}
			found := false
			for _, a := range list.Msg.Accounts {
				found = found || a.Id == created.Msg.Account.Id
			}
			if !found {
				t.Fatalf("ListAccounts over %s misses the account it created", p.name)
			}
			requireAbsent(t, "ListAccounts", list.Msg, cred)

			key, err := admin.keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "key-" + p.name}))
			if err != nil {
				t.Fatalf("CreateKey: %v", err)
			}
			e.secrets.add(key.Msg.Secret)
			if _, err := admin.keys.ListKeys(ctx, connect.NewRequest(&weirv1.ListKeysRequest{})); err != nil {
				t.Fatalf("ListKeys: %v", err)
			}
			hash := HashKey(key.Msg.Secret)
			v, err := dp.leases.VerifyKey(ctx, connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: hash}))
			if err != nil || v.Msg.KeyId != key.Msg.Key.Id {
				t.Fatalf("VerifyKey: %v %v", v, err)
			}
			acq, err := dp.leases.Acquire(ctx, connect.NewRequest(&weirv1.AcquireRequest{
				KeyHash: hash, RequestId: "req-" + p.name, Model: "claude-sonnet-4-5",
			}))
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			l := acq.Msg.GetLease()
			if l == nil || l.AccountId != created.Msg.Account.Id || l.Credential != cred {
				t.Fatalf("Acquire over %s: want a lease on the new account with its credential, got %v", p.name, acq.Msg.GetNoAccount())
			}
			if r, err := dp.leases.RenewBatch(ctx, connect.NewRequest(&weirv1.RenewBatchRequest{LeaseIds: []string{l.Id}})); err != nil || len(r.Msg.RenewedLeaseIds) != 1 {
				t.Fatalf("RenewBatch: %v %v", r, err)
			}
			rel, err := dp.leases.Release(ctx, connect.NewRequest(&weirv1.ReleaseRequest{
				LeaseId: l.Id, Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200},
			}))
			if err != nil || rel.Msg.Decision.GetAction() != weirv1.Action_ACTION_RESPOND {
				t.Fatalf("Release: %v %v", rel, err)
			}
			// Out of routing, so the next protocol's Acquire gets its own account.
			if _, err := admin.accounts.PauseAccount(ctx, connect.NewRequest(&weirv1.PauseAccountRequest{Id: l.AccountId})); err != nil {
				t.Fatalf("PauseAccount: %v", err)
			}
			if _, err := reportOne(ctx, dp.leases, &weirv1.RouteEvent{
				RequestId: "req-" + p.name, KeyId: key.Msg.Key.Id, AccountId: l.AccountId, Status: 200, Attempts: 1,
				Duration: durationpb.New(0), StartedAt: timestamppb.New(e.clock.Now()), Surface: "messages",
			}); err != nil {
				t.Fatalf("ReportRoutes: %v", err)
			}
			events, err := admin.routes.ListRouteEvents(ctx, connect.NewRequest(&weirv1.ListRouteEventsRequest{AccountId: l.AccountId}))
			if err != nil {
				t.Fatalf("ListRouteEvents: %v", err)
			}
			if len(events.Msg.Events) != 1 || events.Msg.Events[0].RequestId != "req-"+p.name {
				t.Fatalf("ListRouteEvents over %s: %v", p.name, events.Msg.Events)
			}
		})
	}
}

// TestUnknownProcedure checks an unrouted path is a plain 404, not a panic
// or an auth bypass.
func TestUnknownProcedure(t *testing.T) {
	t.Parallel()
	e := setup(t)
	resp, err := http.Post(e.ts.URL+"/"+weirv1connect.AccountServiceName+"/Nope", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("status %d, want 404", resp.StatusCode)
	}
}

// TestAuthzEveryProcedure calls every procedure of every weir.v1 service,
// read from the generated descriptors (a new RPC is covered without
// editing this test), with each credential: LeaseService opens to the
// data-plane token only, every other service to the admin token only; a
// client key, either token under the other's services, and nothing at all
// are refused before the handler runs. The dashboard, too, wants its
// login: neither the data-plane token nor a client key opens it.
func TestAuthzEveryProcedure(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createKey("authz-key")
	keySecret := e.secrets.all()[len(e.secrets.all())-1]
	creds := []struct {
		name   string
		header string
	}{
		{"none", ""},
		{"admin token", "Bearer " + e.cfg.AdminToken},
		{"data-plane token", "Bearer " + e.cfg.DataplaneToken},
		{"client key", "Bearer " + keySecret},
	}
	hc := rpcclient.HTTPClient()
	t.Cleanup(hc.CloseIdleConnections)
	var procedures int
	protoregistry.GlobalFiles.RangeFilesByPackage("weir.v1", func(f protoreflect.FileDescriptor) bool {
		for i := range f.Services().Len() {
			svc := f.Services().Get(i)
			want := "admin token"
			if svc.FullName() == weirv1connect.LeaseServiceName {
				want = "data-plane token"
			}
			for j := range svc.Methods().Len() {
				m := svc.Methods().Get(j)
				procedures++
				procedure := "/" + string(svc.FullName()) + "/" + string(m.Name())
				for _, c := range creds {
					t.Run(procedure+"/"+c.name, func(t *testing.T) {
						t.Parallel()
						var opts []connect.ClientOption
						if c.header != "" {
							opts = append(opts, connect.WithInterceptors(rawHeader(c.header)))
						}
						// The empty message is every request's zero value
						// on the wire, and any response decodes into it.
						client := connect.NewClient[emptypb.Empty, emptypb.Empty](hc, e.ts.URL+procedure, opts...)
						ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
						defer cancel()
						var err error
						if m.IsStreamingServer() {
							var stream *connect.ServerStreamForClient[emptypb.Empty]
							stream, err = client.CallServerStream(ctx, connect.NewRequest(&emptypb.Empty{}))
							if err == nil {
								if !stream.Receive() {
									err = stream.Err()
								}
								cancel()
								stream.Close()
							}
						} else {
							_, err = client.CallUnary(ctx, connect.NewRequest(&emptypb.Empty{}))
						}
						code := connect.CodeOf(err)
						if c.name != want {
							if code != connect.CodeUnauthenticated {
								t.Fatalf("%s with %s: %v, want unauthenticated", procedure, c.name, err)
							}
							return
						}
						if err != nil && (code == connect.CodeUnauthenticated || code == connect.CodeUnimplemented) {
							t.Fatalf("%s with %s: %v (refused, or not served)", procedure, c.name, err)
						}
					})
				}
			}
		}
		return true
	})
	if procedures < 35 {
		t.Fatalf("only %d procedures in the descriptors", procedures)
	}
	for _, c := range creds[2:] {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, e.ts.URL+"/dashboard/", nil)
		req.Header.Set("Authorization", c.header)
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/dashboard/login") {
			t.Errorf("dashboard with the %s: %d %q, want the login", c.name, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
}
