package arrowlake.example;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import org.apache.arrow.flight.CallOption;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightEndpoint;
import org.apache.arrow.flight.FlightInfo;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.flight.Location;
import org.apache.arrow.flight.PutResult;
import org.apache.arrow.flight.SyncPutListener;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * A Java client of {@code arrowlake serve}: a filtered read over every endpoint on threads, a
 * put with a commit id and its retry, and the status codes of arrowlake's errors.
 *
 * <pre>
 * java --add-opens=java.base/java.nio=ALL-UNNAMED -jar target/arrowlake-flight-example.jar \
 *     grpc://127.0.0.1:8815 shop.events "x >= 100" people
 * </pre>
 *
 * The put table ({@code people}: one part, so {@code default.people}) must exist with columns
 * {@code id bigint, name string}; Flight does not create tables. Set ARROWLAKE_TOKEN when the
 * server was started with {@code --token-file}.
 */
public final class FlightExample {
  private FlightExample() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 4) {
      System.err.println("usage: FlightExample <location> <read-table> <filter> <put-table>");
      System.exit(2);
    }
    String token = System.getenv("ARROWLAKE_TOKEN");
    CallOption[] options = new CallOption[0];
    if (token != null && !token.isEmpty()) {
      FlightCallHeaders headers = new FlightCallHeaders();
      headers.insert("authorization", "Bearer " + token);
      options = new CallOption[] {new HeaderCallOption(headers)};
    }
    try (BufferAllocator allocator = new RootAllocator();
        FlightClient client = FlightClient.builder(allocator, new Location(args[0])).build()) {
      read(client, options, args[1], args[2]);
      String commitId = "java-example-" + System.currentTimeMillis();
      System.out.println("put " + put(client, allocator, options, args[3], commitId));
      System.out.println("retry " + put(client, allocator, options, args[3], commitId));
      errors(client, allocator, options, args[1], args[3]);
    }
  }

  /** JSON string literal (the example's values hold no control characters). */
  private static String quote(String text) {
    return "\"" + text.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
  }

  private static FlightDescriptor command(String json) {
    return FlightDescriptor.command(json.getBytes(StandardCharsets.UTF_8));
  }

  /** Reads every endpoint of a filtered scan, one thread each; prints rows and the id sum. */
  static void read(FlightClient client, CallOption[] options, String table, String filter)
      throws Exception {
    FlightInfo info = client.getInfo(command(
        "{\"table\": " + quote(table) + ", \"filter\": " + quote(filter)
            + ", \"columns\": [\"id\", \"x\"]}"), options);
    ExecutorService pool = Executors.newFixedThreadPool(4);
    try {
      List<Future<long[]>> parts = new ArrayList<>();
      for (FlightEndpoint endpoint : info.getEndpoints()) {
        parts.add(pool.submit(() -> {
          long rows = 0;
          long idSum = 0;
          try (FlightStream stream = client.getStream(endpoint.getTicket(), options)) {
            while (stream.next()) {
              VectorSchemaRoot root = stream.getRoot();
              BigIntVector ids = (BigIntVector) root.getVector("id");
              for (int i = 0; i < root.getRowCount(); i++) {
                idSum += ids.get(i);
              }
              rows += root.getRowCount();
            }
          }
          return new long[] {rows, idSum};
        }));
      }
      long rows = 0;
      long idSum = 0;
      for (Future<long[]> part : parts) {
        rows += part.get()[0];
        idSum += part.get()[1];
      }
      System.out.println("read endpoints=" + info.getEndpoints().size() + " rows=" + rows
          + " id_sum=" + idSum);
    } finally {
      pool.shutdown();
    }
  }

  /**
   * Puts three rows in one commit and returns the server's answer (JSON). Fields are
   * nullable and carry no field ids: arrowlake takes them by name.
   */
  static String put(FlightClient client, BufferAllocator allocator, CallOption[] options,
      String table, String commitId) throws Exception {
    Schema schema = new Schema(Arrays.asList(
        Field.nullable("id", new ArrowType.Int(64, true)),
        Field.nullable("name", ArrowType.Utf8.INSTANCE)));
    try (VectorSchemaRoot root = VectorSchemaRoot.create(schema, allocator)) {
      BigIntVector ids = (BigIntVector) root.getVector("id");
      VarCharVector names = (VarCharVector) root.getVector("name");
      String[] people = {"ada", "grace", "edsger"};
      root.allocateNew();
      for (int i = 0; i < people.length; i++) {
        ids.setSafe(i, i + 1);
        names.setSafe(i, people[i].getBytes(StandardCharsets.UTF_8));
      }
      root.setRowCount(people.length);
      return putRoot(client, options, command("{\"table\": " + quote(table)
          + ", \"mode\": \"append\", \"commit_id\": " + quote(commitId) + "}"), root);
    }
  }

  private static String putRoot(FlightClient client, CallOption[] options,
      FlightDescriptor descriptor, VectorSchemaRoot root) throws Exception {
    SyncPutListener answers = new SyncPutListener();
    FlightClient.ClientStreamListener stream = client.startPut(descriptor, root, answers,
        options);
    stream.putNext();
    stream.completed();
    String answer = "";
    try (PutResult result = answers.read()) {
      if (result != null) {
        ArrowBuf metadata = result.getApplicationMetadata();
        byte[] bytes = new byte[(int) metadata.readableBytes()];
        metadata.getBytes(0, bytes);
        answer = new String(bytes, StandardCharsets.UTF_8);
      }
    } catch (ExecutionException e) { // the server's error
      throw e.getCause() instanceof FlightRuntimeException
          ? (FlightRuntimeException) e.getCause() : e;
    }
    stream.getResult();
    return answer;
  }

  /** What arrowlake's errors look like to a Java client: code, class, message. */
  static void errors(FlightClient client, BufferAllocator allocator, CallOption[] options,
      String readTable, String putTable) throws Exception {
    report("missing-table", () -> client.getInfo(
        command("{\"table\": \"shop.no_such_table\"}"), options));
    report("bad-filter", () -> client.getInfo(
        command("{\"table\": " + quote(readTable) + ", \"filter\": \"x >\"}"), options));
    report("unknown-column", () -> client.getSchema(
        command("{\"table\": " + quote(readTable) + ", \"columns\": [\"nope\"]}"), options));
    Schema wrong = new Schema(Arrays.asList(Field.nullable("id", ArrowType.Utf8.INSTANCE)));
    try (VectorSchemaRoot root = VectorSchemaRoot.create(wrong, allocator)) {
      ((VarCharVector) root.getVector("id")).setSafe(0, "x".getBytes(StandardCharsets.UTF_8));
      root.setRowCount(1);
      report("wrong-schema", () -> putRoot(client, options,
          command("{\"table\": " + quote(putTable) + "}"), root));
    }
  }

  interface Call {
    Object run() throws Exception;
  }

  private static void report(String what, Call call) throws Exception {
    try {
      call.run();
      System.out.println("error " + what + " none");
    } catch (FlightRuntimeException e) {
      // arrowlake's class is the trailer "arrowlake-error" and the message's first word;
      // pyarrow appends ". Detail: ..." to some messages (see the README).
      String message = e.status().description();
      int detail = message.indexOf(". Detail: ");
      if (detail >= 0) {
        message = message.substring(0, detail);
      }
      System.out.println("error " + what + " " + e.status().code() + " "
          + e.status().metadata().get("arrowlake-error") + " " + message.replace('\n', ' '));
    }
  }
}
