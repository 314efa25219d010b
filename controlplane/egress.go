package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/seal"
	"github.com/weirhq/weir/internal/egress"
)

// Egress proxies.
//
// An account's traffic to its upstream goes out through its own proxy
// (accounts.egress_proxy_sealed), else through the default (the settings
// row egress_proxy, sealed), unless the account says direct: inference
// (the lease carries the whole URL, opened like the credential, and the
// worker dials through it) and the control plane's own calls on the
// account's behalf (usage reads, token refreshes, reset claims, the
// profile read at create time). A URL is sealed at rest like a
// credential (seal.SealProxy, bound to the account, the default to
// uuid.Nil), shown as scheme://host:port only, and never logged. A
// proxy that does not open fails the account's lease and calls as a
// credential that does not open does: nothing goes out direct instead.

// egressInput is a proxy as an operator sets it: shown is what is stored
// in the clear and displayed ("", "direct" or scheme://host:port), url the
// whole URL to seal ("" unless it names a proxy).
type egressInput struct {
	shown, url string
}

// parseEgress reads an account's or the default's proxy, field naming it
// in errors (which never quote it). allowDirect is false for the default:
// it has no default to bypass.
func parseEgress(field, raw string, allowDirect bool) (egressInput, error) {
	switch {
	case raw == "":
		return egressInput{}, nil
	case raw == egress.Direct && allowDirect:
		return egressInput{shown: egress.Direct}, nil
	}
	u, err := egress.Parse(raw)
	if err != nil {
		want := `an http://, https://, socks5:// or socks5h:// URL ([user:pass@]host:port)`
		if allowDirect {
			want += `, "direct" or ""`
		}
		return egressInput{}, invalidf("%s: %v; want %s", field, err, want)
	}
	return egressInput{shown: egress.Display(u), url: u.String()}, nil
}

// sealed is in sealed for account id: nil unless it names a proxy.
func (in egressInput) sealed(s *seal.Sealer, id uuid.UUID) []byte {
	if in.url == "" {
		return nil
	}
	return s.SealProxy(id, in.url)
}

// openEgress is the whole proxy URL account a's traffic goes through ("":
// direct): its own, else the default sealed in defaultSealed (nil: none),
// unless it says direct. An error is seal.ErrUnseal: a proxy this
// replica cannot open.
func openEgress(s *seal.Sealer, a db.Account, defaultSealed []byte) (string, error) {
	switch {
	case a.EgressProxySealed != nil:
		return s.OpenProxy(a.ID, a.EgressProxySealed)
	case a.EgressProxy == egress.Direct || defaultSealed == nil:
		return "", nil
	}
	return s.OpenProxy(uuid.Nil, defaultSealed)
}

// egressDefault reads the default proxy: what operators see, and sealed
// (nil when there is none).
func egressDefault(ctx context.Context, q *db.Queries) (shown string, sealed []byte, err error) {
	row, err := q.EgressDefault(ctx)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, fmt.Errorf("read the default egress proxy: %w", err)
	}
	return row.Value, row.Sealed, nil
}

// egressVia is what an account's traffic goes through, as operators see
// it: its own proxy, else the default's ("" direct).
func egressVia(a db.Account, defaultShown string) string {
	switch a.EgressProxy {
	case "":
		return defaultShown
	case egress.Direct:
		return ""
	}
	return a.EgressProxy
}

// Bounds of each kind of call's clients (egress.Clients): a client per
// proxy in use, at most egressIdleClients unused ones kept, each let go
// after egressIdle unused, longer than a transport keeps an idle
// connection anyway (90 s), so dropping one loses nothing.
const (
	egressIdleClients = 256
	egressIdle        = 2 * time.Minute
)

// egressClients are the control plane's clients for calls on an
// account's behalf, one set per kind of call (each with its own
// timeout), each client going through one proxy.
type egressClients struct {
	usage, oauth, profile *egress.Clients
}

func newEgressClients(cfg Config) egressClients {
	mk := func(c *http.Client) *egress.Clients {
		return egress.NewClients(c, cfg.Now, egressIdleClients, egressIdle)
	}
	return egressClients{usage: mk(cfg.UsageClient), oauth: mk(cfg.OAuthClient), profile: mk(cfg.ProfileClient)}
}

// clientFor is the client of kind for a call on account a's behalf, and
// its release: through the account's proxy, or direct (then base, the
// Config's client of that kind). A proxy this replica cannot open, or a
// client that cannot take one, is an error: the call is not made direct
// instead.
func (j *AccountJobs) clientFor(ctx context.Context, kind *egress.Clients, base *http.Client, a db.Account) (*http.Client, func(), error) {
	var def []byte
	if a.EgressProxySealed == nil && a.EgressProxy != egress.Direct {
		var err error
		if _, def, err = egressDefault(ctx, j.q); err != nil {
			return nil, nil, err
		}
	}
	raw, err := openEgress(j.seal, a, def)
	if err != nil {
		return nil, nil, errors.New("egress proxy unreadable under this secret key")
	}
	if raw == "" {
		return base, func() {}, nil
	}
	c, release, err := kind.Get(raw)
	if err != nil {
		// Never raw's text: it may hold a password.
		return nil, nil, fmt.Errorf("egress proxy: %w", err)
	}
	return c, release, nil
}

// egressURL is the whole proxy URL a new account set to in goes through:
// its own, else the default's ("" direct).
func (a accountService) egressURL(ctx context.Context, in egressInput) (string, error) {
	switch {
	case in.url != "":
		return in.url, nil
	case in.shown == egress.Direct:
		return "", nil
	}
	_, def, err := egressDefault(ctx, a.q)
	if err != nil || def == nil {
		return "", err
	}
	raw, err := a.seal.OpenProxy(uuid.Nil, def)
	if err != nil {
		return "", errors.New("the default egress proxy is unreadable under this secret key")
	}
	return raw, nil
}
