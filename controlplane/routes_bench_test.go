package controlplane

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/rpcclient"
)

// BenchmarkStoreRoutes stores a worker's batch of route events (what one
// ReportRoutes call does, without Connect) into a real Postgres, for
// batch sizes a worker sends at 50, 500 and 5,000 requests a second
// (one call per 20ms). It reports the cost per event (event-µs).
func BenchmarkStoreRoutes(b *testing.B) {
	srv := benchServer(b)
	l := srv.leases()
	// Events name a key and the accounts that served them, as a worker's
	// do: whatever checks or locks those references cost is in the figure.
	ts := startH2C(b, srv.Handler())
	admin := connect.WithInterceptors(rpcclient.Token(srv.cfg.AdminToken))
	hc := rpcclient.HTTPClient()
	key, err := weirv1connect.NewKeyServiceClient(hc, ts.URL, admin).CreateKey(b.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{Name: "bench"}))
	if err != nil {
		b.Fatal(err)
	}
	var accounts []string
	for i := range 8 {
		a, err := weirv1connect.NewAccountServiceClient(hc, ts.URL, admin).CreateAccount(b.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
			Label: "bench-" + strconv.Itoa(i), Credential: apiKey(),
		}))
		if err != nil {
			b.Fatal(err)
		}
		accounts = append(accounts, a.Msg.Account.Id)
	}
	for _, size := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			events := make([]*weirv1.RouteEvent, size)
			n := 0
			for b.Loop() {
				for i := range events {
					n++
					events[i] = &weirv1.RouteEvent{
						RequestId: fmt.Sprintf("weir_bench_%d", n), Surface: "messages", Model: "claude-sonnet-4-5",
						KeyId: key.Msg.Key.Id, AccountId: accounts[n%len(accounts)],
						Status: 200, Attempts: 1, Duration: durationpb.New(40 * time.Millisecond),
						TimeToFirstByte: durationpb.New(3 * time.Millisecond), StartedAt: timestamppb.Now(),
						InputTokens: 1200, OutputTokens: 300,
						AttemptRecords: []*weirv1.AttemptRecord{{At: durationpb.New(time.Millisecond), Status: 200,
							Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Duration: durationpb.New(39 * time.Millisecond)}},
					}
				}
				if err := l.storeRoutes(b.Context(), events, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(n), "event-µs")
		})
	}
}
