package dataplane

import (
	"errors"
	"net/http"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/egress"
)

// Egress proxies: a lease names the proxy its account's requests go
// through (Lease.egress_proxy, whole), or none (direct, Config.Upstream
// as it is). The worker keeps one client per proxy (egress.Clients):
// Config.Upstream's transport cloned, its timeouts, buffers and HTTP/2
// settings kept, with the proxy set, so that requests through one proxy
// share its connections. A proxy's own failure (it could not be reached,
// or refused) is a transport failure of cause PROXY whose text names the
// proxy by scheme://host:port: the account cools as for any transport
// failure and the request fails over.

// Bounds of the clients kept: at most egressIdleClients that no attempt
// uses (the least recently used goes first), each dropped once unused for
// egressIdle, longer than the transport keeps an idle connection (90 s):
// a proxy no lease names any more costs nothing after that.
const (
	egressIdleClients = 256
	egressIdle        = 2 * time.Minute
)

func newEgressClients(cfg Config) *egress.Clients {
	return egress.NewClients(cfg.Upstream, cfg.Now, egressIdleClients, egressIdle)
}

// upstreamClient is the client for an attempt on lease, and its release
// (once the attempt is over, its answer relayed).
func (s *Server) upstreamClient(lease *weirv1.Lease) (*http.Client, func(), error) {
	return s.egress.Get(lease.EgressProxy)
}

// proxyFailure says whether err, an attempt's, was its proxy's, and the
// text that names it ("egress proxy socks5://10.0.0.7:1080 could not be
// reached (connection refused)").
func proxyFailure(err error) (string, bool) {
	var pe *egress.Error
	if errors.As(err, &pe) {
		return pe.Error(), true
	}
	return "", false
}
