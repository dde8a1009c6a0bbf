// kadm-probe: franz-go's admin client (kadm) against a Kafka listener, for the tests.
//
//	kadm-probe -brokers 127.0.0.1:9092 -topic orders -delete-to 3 -add-partitions 2
//
// It calls DescribeTopicConfigs, CreatePartitions, DeleteRecords and ListTransactions
// (franz-go refuses before sending what the broker does not advertise: "broker is too
// old") and prints one JSON object with what each answered; the exit status is 0 when
// every call got an answer (their Kafka errors are in the JSON).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type result struct {
	Configs       map[string]string `json:"configs"`
	ConfigSources map[string]string `json:"configSources"`
	ConfigsError  string            `json:"configsError"`
	AddError      string            `json:"addPartitionsError"`
	Partitions    int               `json:"partitions"`
	LowWatermark  int64             `json:"lowWatermark"`
	DeleteError   string            `json:"deleteRecordsError"`
	Transactions  map[string]string `json:"transactions"`
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "bootstrap address")
	topic := flag.String("topic", "", "an existing topic with records in partition 0")
	deleteTo := flag.Int64("delete-to", 1, "DeleteRecords before this offset of partition 0")
	add := flag.Int("add-partitions", 1, "partitions CreatePartitions adds")
	flag.Parse()

	client, err := kgo.NewClient(kgo.SeedBrokers(*brokers))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer client.Close()
	adm := kadm.NewClient(client)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := result{Configs: map[string]string{}, ConfigSources: map[string]string{}, Transactions: map[string]string{}}

	configs, err := adm.DescribeTopicConfigs(ctx, *topic)
	if err != nil {
		fail("DescribeTopicConfigs", err)
	}
	for _, rc := range configs {
		out.ConfigsError = errText(rc.Err)
		for _, c := range rc.Configs {
			if c.Value != nil {
				out.Configs[c.Key] = *c.Value
			}
			out.ConfigSources[c.Key] = c.Source.String()
		}
	}

	added, err := adm.CreatePartitions(ctx, *add, *topic)
	if err != nil {
		fail("CreatePartitions", err)
	}
	out.AddError = errText(added[*topic].Err)
	details, err := adm.ListTopics(ctx, *topic)
	if err != nil {
		fail("ListTopics", err)
	}
	out.Partitions = len(details[*topic].Partitions)

	offsets := kadm.Offsets{}
	offsets.Add(kadm.Offset{Topic: *topic, Partition: 0, At: *deleteTo})
	deleted, err := adm.DeleteRecords(ctx, offsets)
	if err != nil {
		fail("DeleteRecords", err)
	}
	if d, ok := deleted.Lookup(*topic, 0); ok {
		out.LowWatermark = d.LowWatermark
		out.DeleteError = errText(d.Err)
	}

	listed, err := adm.ListTransactions(ctx, nil, nil)
	if err != nil {
		fail("ListTransactions", err)
	}
	for id, t := range listed {
		out.Transactions[id] = t.State
	}

	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("encoding", err)
	}
}

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
	os.Exit(1)
}
