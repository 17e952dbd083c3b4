"""The `eroica.diagnosis/v1` document: what `eroica diagnose` writes as JSON."""

from __future__ import annotations

from enum import Enum
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

from eroica.schema.hang import HangFinding

DIAGNOSIS_SCHEMA: Final = "eroica.diagnosis/v1"


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class FindingCategory(str, Enum):
    hardware = "hardware"      # goes to people
    software = "software"      # goes to the assistant


class ConfidenceFactors(Frozen):
    """Every factor that multiplies into a finding's confidence, so the number can be read."""

    rule_ratio: float = Field(ge=0, le=1)             # how often the rule is right when it fires (its prior)
    prior_rule_id: str | None = None                  # the rule whose prior that is
    deviation_strength_ratio: float = Field(ge=0, le=1)  # how much the rank costs the job
    step_consistency_ratio: float = Field(ge=0, le=1)    # share of window steps it was slow in
    peer_group_ratio: float = Field(ge=0, le=1)          # size and homogeneity of the peer group
    coverage_ratio: float = Field(ge=0, le=1)            # ranks that reported / world size
    # across the run's windows: 0.8 + 0.2 x the share of windows, from the cause's first, with the same
    # cause on the same ranks (1.0 with a single window: one window cannot say whether it recurs)
    window_consistency_ratio: float = Field(1.0, ge=0, le=1)
    windows_seen_total: NonNegativeInt = 1
    windows_total: NonNegativeInt = 1
    # the taxonomy's resolution: a cause that another cause on the same ranks explains away keeps this share
    explained_away_ratio: float = Field(1.0, ge=0, le=1)
    explained_away_by: str | None = None
    # one verdict per rank: a cause within the taxonomy's contest margin of another on the same rank
    # keeps this share, lowered by the other (eroica.engine.verdicts; 1.0: no contest)
    contested_ratio: float = Field(1.0, ge=0, le=1)
    contested_by: str | None = None
    # the rule's `needs`: evidence its rank could not collect, and the factor that costs (1.0: none missing)
    evidence_gap_ratio: float = Field(1.0, ge=0, le=1)
    evidence_missing: list[str] = Field(default_factory=list)
    # the job's own history: the finding's cost lies in pauses the job made from its start, as long and as
    # often (a checkpoint rank 0 writes every N steps): by design, not the slowdown; this share is kept
    # (1.0: not so), and the job's first such pause
    standing_ratio: float = Field(1.0, ge=0, le=1)
    standing_step: int | None = None
    peer_group: str
    peer_group_valid: bool
    # the strength measures only what the cause costs, not whether it is there: the rule concluded from
    # measurements of the cause itself (a cgroup at its limit, workers busy, foreign processes' CPU), not
    # from the rank's excess; its presence is then the confidence without the strength
    strength_is_cost_only: bool = False

    def terms(self) -> list[tuple[str, float]]:
        """(label, value) of each factor in the product, the prior and the always-measured four first,
        then those that lowered it (a factor of 1.0 that need not apply is left out)."""
        out = [(label, float(getattr(self, name))) for name, label, always, _ in FACTORS
               if always or float(getattr(self, name)) != 1.0]
        return out

    def explain(self, confidence: float) -> str:
        """'prior 0.85 (rule) x strength 0.90 x ... = 0.77': how the confidence was reached."""
        parts = [f"{label} {v:.2f}" for label, v in self.terms()]
        return " x ".join(parts) + f" = {confidence:.2f}"


#: the factors of a finding's confidence, in the order they multiply: (field, label, always shown, how it is
#: measured); `eroica rules show` and docs/rule-authoring.md say these, and the reports print the product
FACTORS: Final = (
    ("rule_ratio", "prior", True, "the deciding rule's prior: how often it is right when it fires (fitted on the "
     "incident library into knowledge/priors.yaml for shipped rules; the rule's emit.confidence otherwise; a "
     "site override's confidence wins)"),
    ("deviation_strength_ratio", "strength", True, "what the rank costs the job: 0.5 at 5% of a step, rising to "
     "1.0 from 25%"),
    ("step_consistency_ratio", "consistency", True, "0.6 + 0.4 x the share of the window's steps it was slow in"),
    ("peer_group_ratio", "peers", True, "1.0 for a valid group of 4 or more, 0.85 under 4, 0.5 when the peers are "
     "no peers (other programs by design), 0.2 alone; 1.0 for basis expected_range or absolute"),
    ("coverage_ratio", "coverage", True, "0.5 + 0.5 x the share of the world's ranks that reported"),
    ("evidence_gap_ratio", "evidence missing", False, "the rule's missing_evidence_factor when the rank could not "
     "collect a source it `needs`"),
    ("explained_away_ratio", "explained away", False, "the taxonomy's explained_away_factor when a more specific "
     "cause on the same ranks explains it"),
    ("contested_ratio", "contested", False, "the taxonomy's contest_factor when another cause on the same rank is "
     "within contest_margin and no deciding evidence settles it"),
    ("standing_ratio", "standing", False, "0.5 when the finding's cost lies in pauses the job made from its start, "
     "as long and as often (by design: present, but not the slowdown)"),
    ("window_consistency_ratio", "across windows", False, "0.8 + 0.2 x the share of the run's windows, from "
     "the cause's first, with the same cause on the same ranks"),
)


class SignalComparison(Frozen):
    """One hardware signal of a culprit rank beside its peers' median and spread (10th-90th pct)."""

    signal: str
    value: float
    peer_median: float
    peer_p10: float
    peer_p90: float


class FindingCost(Frozen):
    """What the finding costs the job, and what fixing it would recover."""

    excess_seconds_per_step: float           # the culprit's extra busy time: every rank waits for it
    step_seconds: float                      # the job's median step in the window
    step_seconds_if_fixed: float             # the step if the culprit ran like its peers
    ranks_waiting_total: NonNegativeInt      # the ranks that wait (the world size)
    accelerator_hours_lost_per_hour: float   # ranks x excess / step
    recovered_ratio: float = Field(ge=0, le=1)  # share of the step time a fix recovers
    # the cause of a finding before this one, on the same ranks, whose excess this is too: this cost is
    # that one's, not to be added to it (None: this finding's own)
    same_excess_as: str | None = None


class SettingDeviation(Frozen):
    """A setting of the culprit rank that differs from its peers' (what a config change would align)."""

    key: str
    value: str
    peer_value: str


class Finding(Frozen):
    root_cause: str
    category: FindingCategory
    component: str
    ranks: list[NonNegativeInt]
    hosts: list[str]
    function: str | None
    confidence: float = Field(ge=0, le=1)
    confidence_factors: ConfidenceFactors
    # how sure the cause is present, apart from what it costs the job (`cost`): above the confidence where
    # the strength measures only cost (prefetching hides a memory-starved loader: present, costs nothing)
    presence_confidence: float | None = Field(None, ge=0, le=1)
    summary: str
    evidence: list[str]
    rule_ids: list[str]
    derived_via: list[str] = Field(default_factory=list)   # the rules that derived the hypotheses on the way
    rule_status: dict[str, str] = Field(default_factory=dict)  # each rule's lifecycle status (experimental...)
    fix_template: str | None = None
    runbook: str | None = None
    insufficient_peer_evidence: bool = False
    excess_seconds_per_step: float = 0.0
    signals: list[SignalComparison] = Field(default_factory=list)   # the culprit's hardware signature
    cost: FindingCost | None = None
    settings: list[SettingDeviation] = Field(default_factory=list)
    # where the culprit's code is, as its collector recorded it (`step`, `loader`, `region.<name>` ->
    # "path:line"); empty when the privacy level hid paths or the run predates it
    sites: dict[str, str] = Field(default_factory=dict)
    # "host": every rank of one host (two or more) showed this cause, so it is the host's problem (its
    # link, its CPUs, its cgroup), named once; "rank": the ranks named, not their host
    scope: Literal["rank", "host"] = "rank"
    # where each rank named runs: "host/device" ("node07/cuda:3"; "node07/cpu" on the CPU path)
    devices: list[str] = Field(default_factory=list)

    @property
    def placed(self) -> list[str]:
        """Where the named ranks run, as people look for them: host/device on accelerators, the
        hosts alone on the CPU path."""
        return self.devices if any(not d.endswith("/cpu") for d in self.devices) else self.hosts


class Coverage(Frozen):
    world_size: NonNegativeInt
    ranks_reported: list[NonNegativeInt]
    ranks_missing: list[NonNegativeInt]
    coverage_ratio: float = Field(ge=0, le=1)
    file_problems: list[str]
    collector_gaps: list[str]
    window_steps: NonNegativeInt
    pattern_bytes_per_rank_median: NonNegativeInt
    collector_overhead: dict[str, float]
    privacy_levels: list[str] = Field(default_factory=list)   # what the collectors did to names


class StepSummary(Frozen):
    before_median_seconds: float | None
    during_median_seconds: float | None
    slowdown_ratio: float | None
    per_rank_during_seconds: dict[str, float]
    per_rank_busy_seconds: dict[str, float]
    per_rank_comm_wait_seconds: dict[str, float]


class HeatmapRow(Frozen):
    label: str
    rank: NonNegativeInt | None                     # None for an aggregate of many ranks
    busy_excess_seconds: float                      # busy time per step beyond the group median
    values_seconds: list[float]                     # per function: s/step beyond the group median


class Heatmap(Frozen):
    """Rank x function deviation from the peer median (s/step), culprits first; beyond the first
    ranks the rest is aggregated into percentile rows."""

    functions: list[str]                            # "category:name"
    peer_median_seconds: list[float]                # per function, s/step
    rows: list[HeatmapRow]
    aggregated_ranks_total: NonNegativeInt = 0


class StepSeries(Frozen):
    """The job's step times (median over ranks): the steps before the window, then the window's."""

    before_seconds: list[float]
    during_seconds: list[float]
    per_rank_before_seconds: dict[str, float]       # each rank's baseline median


class PeerGroupInfo(Frozen):
    name: str
    ranks: list[NonNegativeInt]
    valid: bool
    reason: str


HISTORY_DEVIATIONS_MAX: Final = 4096     # config deviations a window's history summary keeps


class ConfigSeen(Frozen):
    """A rank that ran with `key=value` while most of its peer group ran `peer_value`."""

    rank: NonNegativeInt
    key: str
    value: str
    peer_value: str


class FindingSeen(Frozen):
    root_cause: str
    ranks: list[NonNegativeInt]


class WindowHistory(Frozen):
    """What a later window of the same run needs of this one, instead of its documents: the job's
    step time then, the settings in which ranks differed from their peers, and what was found.
    A later window's config deviation that this window already showed while the job was clearly
    faster cannot explain the later slowdown; a cause found again on the same ranks is surer."""

    window: str
    start_step: NonNegativeInt
    job_step_seconds: float = Field(ge=0)          # the median rank's step time in the window
    config_deviations: list[ConfigSeen] = Field(default_factory=list, max_length=HISTORY_DEVIATIONS_MAX)
    config_deviations_dropped: NonNegativeInt = 0  # past HISTORY_DEVIATIONS_MAX: not kept
    findings: list[FindingSeen] = Field(default_factory=list)


class WindowDiagnosis(Frozen):
    window: str
    start_step: NonNegativeInt
    end_step: NonNegativeInt
    trigger: str
    findings: list[Finding]
    coverage: Coverage
    steps: StepSummary
    peer_groups: list[PeerGroupInfo]
    healthy: bool
    # "healthy" is a conclusion that needs evidence: below the coverage floor (knowledge/taxonomy.yaml
    # coverage_floor) the window is not diagnosable, whatever its findings say
    diagnosable: bool = True
    not_diagnosable_reason: str | None = None
    heatmap: Heatmap | None = None
    step_series: StepSeries | None = None
    raw_traces: dict[str, str] = Field(default_factory=dict)   # rank -> bounded Chrome-trace file
    # what a later window of the run reads of this one (eroica.engine.history), so that it is never
    # loaded again
    history: WindowHistory | None = None
    # every rule that concluded on this window (whether or not its conclusion became a finding) and
    # every rule that derived a hypothesis on the way: `eroica rules coverage` counts them
    rules_fired: list[str] = Field(default_factory=list)


class CulpritSighting(Frozen):
    """One window of a culprit's story: how sure that window was, and what it cost the job there."""

    window: str
    start_step: NonNegativeInt
    ranks: list[int]
    confidence: float = Field(ge=0, le=1)
    excess_seconds_per_step: float = Field(ge=0)     # its cost in that window (0: none measured)


class CulpritStory(Frozen):
    """A cause over the job's windows (eroica.engine's `story`): chronic (window after window), intermittent
    (recurring with the job healthy between: a window without it, or steps of the later window's series
    at the healthy step), rotating (the same cause on a different rank each time: something the ranks
    share), transient (once, not since), or new (once, in the latest window)."""

    root_cause: str
    ranks: list[int]                   # every rank it was seen on
    kind: Literal["chronic", "intermittent", "rotating", "transient", "new"]
    windows_seen_total: NonNegativeInt
    windows_since_total: NonNegativeInt   # the diagnosable windows from its first sighting to the latest
    sightings: list[CulpritSighting]
    summary: str


class Diagnosis(Frozen):
    schema_: Literal["eroica.diagnosis/v1"] = Field(DIAGNOSIS_SCHEMA, alias="schema")
    run_dir: str
    eroica_version: str
    rules_loaded: NonNegativeInt
    # what the site knowledge changed in the shipped rules (added, replaced, disabled, overridden): a
    # window read "healthy" may be one whose rule a site disabled
    knowledge: list[str] = Field(default_factory=list)
    windows: list[WindowDiagnosis]
    hang: HangFinding | None = None       # the run's latest hang (eroica.engine.hang), reported first
    # each confident cause over the windows diagnosed together (eroica.engine.story); [] with one window
    story: list[CulpritStory] = Field(default_factory=list)
