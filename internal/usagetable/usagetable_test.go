package usagetable

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestCSV: the header names the groupings in the order asked, then the
// counts; a deleted key shows its id, a day begins in the zone asked and
// the cost is in dollars to the millionth.
func TestCSV(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip("no time zone data:", err)
	}
	day := time.Date(2030, 3, 3, 23, 0, 0, 0, time.UTC) // midnight in Berlin
	rows := []*weirv1.UsageRow{
		{KeyId: "k1", KeyName: "alice", PeriodStart: timestamppb.New(day), Requests: 3, InputTokens: 10, OutputTokens: 20,
			CacheReadTokens: 30, CacheCreationTokens: 40, ReasoningTokens: 5, CostUsd: 1.23456789},
		{KeyId: "0b6f", PeriodStart: timestamppb.New(day), Requests: 1, CostUsd: 0.0000004},
	}
	var b strings.Builder
	if err := WriteCSV(&b, []string{"Key", " day"}, rows, berlin); err != nil {
		t.Fatal(err)
	}
	want := "key,day,requests,input_tokens,output_tokens,cache_read_tokens,cache_creation_tokens,reasoning_tokens,cost_usd\n" +
		"alice,2030-03-04,3,10,20,30,40,5,1.234568\n" +
		"0b6f,2030-03-04,1,0,0,0,0,0,0\n"
	if b.String() != want {
		t.Errorf("CSV:\n%s\nwant:\n%s", b.String(), want)
	}
}
