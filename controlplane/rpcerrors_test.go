package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgconn"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/syncbuf"
)

// failingAliases answers ListAliases with err, as a handler that failed.
type failingAliases struct {
	weirv1connect.UnimplementedAliasServiceHandler
	err error
}

func (f failingAliases) ListAliases(context.Context, *connect.Request[weirv1.ListAliasesRequest]) (*connect.Response[weirv1.ListAliasesResponse], error) {
	return nil, f.err
}

// TestErrorInterceptor: through a real Connect server, each kind of
// handler error reaches the client with its code and no internal detail,
// and is logged once when the client cannot act on it. A secret in a
// database error (a row's values are in the error's Detail, as a unique or
// check violation reports them) reaches neither the client nor the log:
// what is logged is the error's text, which leaves Detail out, and a
// conflict is named by its constraint only.
func TestErrorInterceptor(t *testing.T) {
	t.Parallel()
	const secret = "sk-ant-api03-interceptor-secret"
	const procedure = "/weir.v1.AliasService/ListAliases"
	rowError := func(code string) *pgconn.PgError {
		return &pgconn.PgError{Severity: "ERROR", Code: code, Message: "statement failed",
			ConstraintName: "accounts_provider_identity", Detail: "Key (credential)=(" + secret + ") already exists."}
	}
	cases := []struct {
		name   string
		err    error
		code   connect.Code
		msg    string
		logged bool
	}{
		{"invalid", invalidf("limit: must not be negative"), connect.CodeInvalidArgument, "limit: must not be negative", false},
		{"not found", fmt.Errorf("route event %q: %w", "r1", ErrNotFound), connect.CodeNotFound, `route event "r1": not found`, false},
		{"conflict", storeErr(rowError("23505")), connect.CodeAlreadyExists, "already exists (accounts_provider_identity)", false},
		{"cancelled", fmt.Errorf("list aliases: %w", context.Canceled), connect.CodeCanceled, "list aliases: context canceled", false},
		{"chosen by the handler", connect.NewError(connect.CodePermissionDenied, errKeyRejected), connect.CodePermissionDenied, errKeyRejected.Error(), false},
		{"deadline", fmt.Errorf("list aliases: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded, "list aliases: context deadline exceeded", true},
		{"database down", fmt.Errorf("list aliases: %w", syscall.ECONNREFUSED), connect.CodeUnavailable, "database unavailable", true},
		{"database restarting", rowError("57P01"), connect.CodeUnavailable, "database unavailable", true},
		{"internal", fmt.Errorf("list aliases: %w", rowError("23514")), connect.CodeInternal, "internal error", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			logs := &syncbuf.Buffer{}
			log := slog.New(slog.NewTextHandler(logs, nil))
			mux := http.NewServeMux()
			mux.Handle(weirv1connect.NewAliasServiceHandler(failingAliases{err: c.err},
				connect.WithInterceptors(errorInterceptor(log))))
			ts := httptest.NewServer(mux)
			t.Cleanup(ts.Close)
			client := weirv1connect.NewAliasServiceClient(ts.Client(), ts.URL)

			_, err := client.ListAliases(t.Context(), connect.NewRequest(&weirv1.ListAliasesRequest{}))
			ce := wantCode(t, err, c.code)
			if ce.Message() != c.msg {
				t.Errorf("message %q, want %q", ce.Message(), c.msg)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(fmt.Sprint(ce.Details()), secret) {
				t.Errorf("the secret reached the client: %v", err)
			}
			out := logs.String()
			if strings.Contains(out, secret) {
				t.Errorf("the secret reached the log:\n%s", out)
			}
			lines := strings.Count(out, `msg="rpc failed"`)
			switch {
			case !c.logged && out != "":
				t.Errorf("logged, want nothing:\n%s", out)
			case c.logged && (lines != 1 || strings.Count(out, "\n") != 1):
				t.Errorf("want one rpc failed line, got:\n%s", out)
			case c.logged && (!strings.Contains(out, "level=ERROR") || !strings.Contains(out, "op="+procedure) ||
				!strings.Contains(out, "err=")):
				t.Errorf("log line lacks its level, procedure or error:\n%s", out)
			}
		})
	}
}

// TestErrorInterceptorCalledOff: a call whose deadline passed before the
// handler runs is refused by Connect (its handler returns the context's
// error at once), not a failure of ours: passed on, nothing logged.
func TestErrorInterceptorCalledOff(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	next := connect.UnaryFunc(func(ctx context.Context, _ connect.AnyRequest) (connect.AnyResponse, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, errors.New("the handler ran")
	})
	ctx, cancel := context.WithTimeout(t.Context(), 0)
	defer cancel()
	_, err := errorInterceptor(slog.New(slog.NewTextHandler(logs, nil)))(next)(ctx, connect.NewRequest(&weirv1.ListAliasesRequest{}))
	if err != context.DeadlineExceeded {
		t.Errorf("err = %v, want the context's own deadline error", err)
	}
	if logs.String() != "" {
		t.Errorf("logged:\n%s", logs.String())
	}
}
