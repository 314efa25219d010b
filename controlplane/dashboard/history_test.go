package dashboard

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The history charts' axis starts at the earliest data: a usage point or
// a bucket with requests or holds; an empty bucket is no data.
func TestFirstData(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	if _, ok := firstData(nil, nil); ok {
		t.Error("no data has a first")
	}
	series := []*weirv1.UsageSeries{{Points: []*weirv1.UsagePoint{{At: timestamppb.New(now.Add(-10 * time.Minute))}}}}
	buckets := []*weirv1.RouteBucket{
		{Start: timestamppb.New(now.Add(-time.Hour))},
		{Start: timestamppb.New(now.Add(-20 * time.Minute)), Requests: 3},
	}
	if got, ok := firstData(series, buckets); !ok || !got.Equal(now.Add(-20*time.Minute)) {
		t.Errorf("first %v %v, want 20 minutes ago (the empty bucket an hour ago is no data)", got, ok)
	}
}
