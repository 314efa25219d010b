package dataplane

import (
	"context"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pricing"
)

// workerSettings are the control plane's runtime settings as this worker
// last saw them.
type workerSettings struct {
	capacityHold    time.Duration
	unreachableHold time.Duration
	requestDeadline time.Duration
	quotaMode       weirv1.QuotaResponseMode
	body            bodyLimits
	// prices price the unreported spend of budgeted keys: the shipped
	// table under the operator's prices.
	prices *pricing.Table
}

// settingsPoller keeps workerSettings fresh, so an operator's change
// reaches every worker within one poll, without restart.
type settingsPoller struct {
	s       *Server
	current atomic.Pointer[workerSettings]
	stop    context.CancelFunc
	done    chan struct{}
}

func newSettingsPoller(s *Server) *settingsPoller {
	p := &settingsPoller{s: s, done: make(chan struct{})}
	p.current.Store(&workerSettings{capacityHold: s.cfg.CapacityHold, unreachableHold: s.cfg.UnreachableHold,
		requestDeadline: s.cfg.RequestDeadline, body: bodyLimits{total: s.cfg.BodyBuffer, perKey: s.cfg.BodyBufferPerKey},
		prices: pricing.NewTable(nil)})
	ctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	go p.run(ctx)
	return p
}

func (p *settingsPoller) get() workerSettings { return *p.current.Load() }

func (p *settingsPoller) run(ctx context.Context) {
	defer close(p.done)
	t := time.NewTicker(p.s.cfg.SettingsPoll)
	defer t.Stop()
	for {
		p.fetch(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *settingsPoller) fetch(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := p.s.leases.WorkerSettings(ctx, connect.NewRequest(&weirv1.WorkerSettingsRequest{}))
	if err != nil {
		if ctx.Err() == nil {
			p.s.cfg.Logger.Debug("read settings failed", "err", err)
		}
		return
	}
	st := resp.Msg.GetSettings()
	next := workerSettings{capacityHold: st.GetCapacityHold().AsDuration(), unreachableHold: st.GetUnreachableHold().AsDuration(),
		requestDeadline: st.GetRequestDeadline().AsDuration(), quotaMode: st.GetQuotaResponseMode(),
		body:   bodyLimits{total: st.GetBodyBufferBytes(), perKey: st.GetBodyBufferPerKeyBytes()},
		prices: priceTable(resp.Msg.GetPrices())}
	if next.requestDeadline <= 0 {
		next.requestDeadline = p.s.cfg.RequestDeadline
	}
	if next.capacityHold < 0 {
		next.capacityHold = 0
	}
	switch {
	case st.GetUnreachableHold() == nil:
		// A control plane older than the setting.
		next.unreachableHold = p.s.cfg.UnreachableHold
	case next.unreachableHold < 0:
		next.unreachableHold = 0
	}
	// 0 is a control plane older than the settings.
	if next.body.total <= 0 {
		next.body.total = p.s.cfg.BodyBuffer
	}
	if next.body.perKey <= 0 {
		next.body.perKey = p.s.cfg.BodyBufferPerKey
	}
	p.current.Store(&next)
}

func (p *settingsPoller) close() {
	p.stop()
	<-p.done
}
