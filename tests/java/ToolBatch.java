// Runs several of Kafka's command-line tools in one JVM, one after the other, so that a
// test pays one JVM start instead of one per command (a 2-core CI machine: 3-4 s each).
//
//   java -cp '<kafka libs>/*' ToolBatch.java <commands file>
//
// The commands file holds one command a line: the main class, then its arguments,
// separated by tabs. Each command's output is framed on stdout by
//   ==== begin <n>
//   ==== end <n> exit=<code> ms=<how long it took>
// where the code is the first one the tool passed to Kafka's Exit.exit (0 when it
// returned): some tools exit in a finally block that their main catches around, as
// TopicCommand does, and the JVM would have ended at that first call.
// Tools print on System.out (Java) or Console.out (Scala): the streams are never
// swapped, so both land in order between the markers.
import java.lang.reflect.InvocationTargetException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import org.apache.kafka.common.utils.Exit;

public class ToolBatch {
    static final class Exited extends RuntimeException {
        final int code;

        Exited(int code) {
            super(null, null, false, false);
            this.code = code;
        }
    }

    static Integer first;

    static void exit(int code) {
        if (first == null) {
            first = code;
        }
        throw new Exited(code);
    }

    public static void main(String[] argv) throws Exception {
        Exit.setExitProcedure((code, message) -> exit(code));
        Exit.setHaltProcedure((code, message) -> exit(code));
        List<String> lines = Files.readAllLines(Path.of(argv[0]));
        int n = 0;
        for (String line : lines) {
            if (line.isBlank()) {
                continue;
            }
            String[] parts = line.split("\t");
            String[] args = Arrays.copyOfRange(parts, 1, parts.length);
            for (java.io.PrintStream stream : new java.io.PrintStream[] {System.out, System.err}) {
                stream.println("==== begin " + n);
                stream.flush();
            }
            long started = System.nanoTime();
            int code = run(parts[0], args);
            long ms = (System.nanoTime() - started) / 1_000_000;
            for (java.io.PrintStream stream : new java.io.PrintStream[] {System.out, System.err}) {
                stream.flush();
                stream.println("==== end " + n + " exit=" + code + " ms=" + ms);
                stream.flush();
            }
            n++;
        }
        Exit.resetExitProcedure();
        System.exit(0);
    }

    static int run(String mainClass, String[] args) {
        first = null;
        int code;
        try {
            Class.forName(mainClass).getMethod("main", String[].class).invoke(null, (Object) args);
            code = 0;
        } catch (InvocationTargetException e) {
            if (!(e.getCause() instanceof Exited)) {
                e.getCause().printStackTrace();
            }
            code = 99;
        } catch (Exception e) {
            e.printStackTrace();
            code = 98;
        }
        return first != null ? first : code;
    }
}
