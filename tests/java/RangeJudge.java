import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

import org.apache.kafka.common.Uuid;
import org.apache.kafka.coordinator.group.api.assignor.GroupAssignment;
import org.apache.kafka.coordinator.group.api.assignor.GroupSpec;
import org.apache.kafka.coordinator.group.api.assignor.MemberAssignment;
import org.apache.kafka.coordinator.group.api.assignor.MemberSubscription;
import org.apache.kafka.coordinator.group.api.assignor.SubscribedTopicDescriber;
import org.apache.kafka.coordinator.group.api.assignor.SubscriptionType;
import org.apache.kafka.coordinator.group.assignor.RangeAssignor;

/**
 * Kafka's own server-side range assignor (KIP-848, group-coordinator) over a sequence of
 * group memberships, for comparing ours with it (tests/integration/test_kafka_range_assignor_java.py).
 *
 * Arguments: the partition counts ("t=4,u=3"), then one argument per step, the members
 * then in the group: "m1@i1:t,u;m2:t" (member id, "@instance id" for a static member,
 * its topics). Each step's previous target is the one before it. Prints one line per
 * step: "m1=t-0,t-1,u-0;m2=t-2" (members and partitions sorted).
 */
public class RangeJudge {
    public static void main(String[] args) {
        Map<String, Integer> counts = new LinkedHashMap<>();
        for (String kv : args[0].split(",")) {
            String[] p = kv.split("=");
            counts.put(p[0], Integer.parseInt(p[1]));
        }
        Map<String, Uuid> ids = new HashMap<>();
        Map<Uuid, String> names = new HashMap<>();
        for (String t : counts.keySet()) {
            Uuid id = Uuid.randomUuid();
            ids.put(t, id);
            names.put(id, t);
        }
        SubscribedTopicDescriber describer = new SubscribedTopicDescriber() {
            public int numPartitions(Uuid topicId) {
                String name = names.get(topicId);
                return name == null ? -1 : counts.get(name);
            }

            public Set<String> racksForPartition(Uuid topicId, int partition) {
                return Set.of();
            }
        };
        Map<String, MemberAssignment> previous = new HashMap<>();
        RangeAssignor assignor = new RangeAssignor();
        for (int step = 1; step < args.length; step++) {
            Map<String, MemberSubscription> subs = new LinkedHashMap<>();
            for (String m : args[step].split(";")) {
                String[] parts = m.split(":");
                String[] who = parts[0].split("@");
                Set<Uuid> topics = new TreeSet<>((a, b) -> names.get(a).compareTo(names.get(b)));
                for (String t : parts[1].split(",")) topics.add(ids.get(t));
                Optional<String> instance = who.length > 1 ? Optional.of(who[1]) : Optional.empty();
                subs.put(who[0], new MemberSubscription() {
                    public Optional<String> rackId() { return Optional.empty(); }
                    public Optional<String> instanceId() { return instance; }
                    public Set<Uuid> subscribedTopicIds() { return topics; }
                });
            }
            boolean same = subs.values().stream().map(MemberSubscription::subscribedTopicIds)
                .distinct().count() <= 1;
            Map<String, MemberAssignment> before = previous;
            GroupSpec spec = new GroupSpec() {
                public Collection<String> memberIds() { return subs.keySet(); }
                public SubscriptionType subscriptionType() {
                    return same ? SubscriptionType.HOMOGENEOUS : SubscriptionType.HETEROGENEOUS;
                }
                public boolean isPartitionAssigned(Uuid topicId, int partition) {
                    return before.values().stream().anyMatch(a ->
                        a.partitions().getOrDefault(topicId, Set.of()).contains(partition));
                }
                public boolean isPartitionAssignable(Uuid topicId, int partition) { return true; }
                public MemberSubscription memberSubscription(String memberId) { return subs.get(memberId); }
                public MemberAssignment memberAssignment(String memberId) {
                    MemberAssignment a = before.get(memberId);
                    return a != null ? a : () -> Map.of();
                }
            };
            GroupAssignment got = assignor.assign(spec, describer);
            previous = new HashMap<>(got.members());
            TreeMap<String, String> line = new TreeMap<>();
            for (String member : subs.keySet()) {
                MemberAssignment a = got.members().get(member);
                List<String> tps = new ArrayList<>();
                if (a != null) {
                    a.partitions().forEach((tid, ps) -> ps.forEach(p -> tps.add(names.get(tid) + "-" + p)));
                }
                tps.sort((x, y) -> {
                    String[] a1 = x.split("-"), b1 = y.split("-");
                    int c = a1[0].compareTo(b1[0]);
                    return c != 0 ? c : Integer.compare(Integer.parseInt(a1[1]), Integer.parseInt(b1[1]));
                });
                line.put(member, String.join(",", tps));
            }
            List<String> out = new ArrayList<>();
            line.forEach((m, tps) -> out.add(m + "=" + tps));
            System.out.println(String.join(";", out));
        }
    }
}
