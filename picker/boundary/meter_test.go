package boundary

import (
	"testing"
	"time"
)

func TestMeterCapsTheBodyAndTimesOnlyAnUnfinishedOne(t *testing.T) {
	both := Limits{MaxBodyBytes: 10, BodyTimeout: time.Second}
	cases := []struct {
		name   string
		limits Limits
		events func(m *meter) []step
		want   []step
	}{
		{"no body: no clock", both, func(m *meter) []step { return []step{m.headers(true)} }, []step{pass}},
		{"body within the cap", both, func(m *meter) []step {
			return []step{m.headers(false), m.body(4, false), m.body(6, true)}
		}, []step{startClock, pass, stopClock}},
		{"one byte over", both, func(m *meter) []step {
			return []step{m.headers(false), m.body(10, false), m.body(1, true)}
		}, []step{startClock, pass, tooLarge}},
		{"first chunk starts the clock without headers", both, func(m *meter) []step {
			return []step{m.body(1, false), m.body(1, false), m.body(1, true)}
		}, []step{startClock, pass, stopClock}},
		{"a one-chunk body never timed", both, func(m *meter) []step {
			return []step{m.body(3, true)}
		}, []step{pass}},
		{"nothing after the end is charged", both, func(m *meter) []step {
			return []step{m.headers(false), m.body(10, true), m.body(100, true)}
		}, []step{startClock, stopClock, pass}},
		{"no cap: any size", Limits{BodyTimeout: time.Second}, func(m *meter) []step {
			return []step{m.headers(false), m.body(1<<30, true)}
		}, []step{startClock, stopClock}},
		{"no timeout: no clock", Limits{MaxBodyBytes: 10}, func(m *meter) []step {
			return []step{m.headers(false), m.body(5, false), m.body(5, true)}
		}, []step{pass, pass, pass}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := &meter{limits: c.limits}
			got := c.events(m)
			if len(got) != len(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("got %v, want %v", got, c.want)
				}
			}
		})
	}
}
