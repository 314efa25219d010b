package controlplane

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

const (
	kindCodex        = weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT
	kindInsufficient = weirv1.QuotaKind_QUOTA_KIND_OPENAI_INSUFFICIENT_QUOTA
)

// TestQuotaWithQuota: the write carries the record's columns; a record
// without a reset leaves quota_resets_at NULL, and no record leaves every
// quota column at its zero.
func TestQuotaWithQuota(t *testing.T) {
	t.Parallel()
	base := db.WriteCooldownParams{AccountID: uuid.New(), Reason: "quota_exhausted", Until: epoch.Add(time.Hour)}
	p := withQuota(base, &policy.QuotaRecord{Kind: kindCodex, ResetsAt: epoch.Add(time.Hour), WindowMinutes: 300, Message: "m"})
	if p.QuotaKind == nil || *p.QuotaKind != "codex_usage_limit" || p.QuotaResetsAt == nil || !p.QuotaResetsAt.Equal(epoch.Add(time.Hour)) ||
		p.QuotaWindowMinutes != 300 || p.QuotaMessage != "m" || p.AccountID != base.AccountID || p.Reason != base.Reason {
		t.Errorf("with a reset: %+v", p)
	}
	p = withQuota(base, &policy.QuotaRecord{Kind: kindInsufficient, Message: "billing"})
	if p.QuotaKind == nil || *p.QuotaKind != "openai_insufficient_quota" || p.QuotaResetsAt != nil || p.QuotaWindowMinutes != 0 || p.QuotaMessage != "billing" {
		t.Errorf("without a reset: %+v", p)
	}
	if p = withQuota(base, nil); p.QuotaKind != nil || p.QuotaResetsAt != nil || p.QuotaWindowMinutes != 0 || p.QuotaMessage != "" {
		t.Errorf("no record: %+v", p)
	}
}
